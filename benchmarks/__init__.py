"""Side-by-side benchmarks of datasetrt against its peers (run as `python -m benchmarks.<name>`).

Entry points, one benchmark each:
  run             the suite: composes the read, torch, write and open sections below, ends with
                  the targets table
  reader          reader worker processes vs dataset-rt 0.4.8 (per-sample and batch paths)
  foundation      single-process write, read and open vs dataset-rt
  integrity_cost  reads with and without per-record checksum verification
  loader          to_torch_dataloader end to end vs dataset-rt and a plain torch DataLoader
  torch_batches   int32[512] records to [256, 512] tensors through each library's torch path
  memory          steady and peak tree PSS of one epoch per configuration (memory_readers: the
                  configuration run inside the measured process)
  sources         conversions from Parquet / Arrow / JSON Lines, local and on Ray
  sampling        planning and read rates of the sampling modes
  zstd_dict       compression ratio and read rates of zstd_dict vs zstd, lz4 and loaderx
  targets         the suite's targets and detail tables from a suite JSON
  report          markdown tables of any benchmark JSON (and the tables every module renders)

Shared layers (each imports only from the ones listed above it; the entry points import them,
and run also composes torch_batches and targets):
  common          medians, per-repeat figures, digests, tree PSS (datasetrt's own sampler), the
                  child process a contender runs in, ratio tables, the JSON record
  caches          sources, cache writing, many small caches, opening, one timed read pass
  suite           the suite's contender labels, read parameters and its child-process task
  report          tables and the plot
  peers, stream_peers, cache_reads   the suite's read contenders (loaderx, torch memmap, limits;
                  MosaicML Streaming, LitData; datasetrt and dataset-rt on the cache)
  workloads       the suite's generated workloads and the stores built from them
  reads, writes, opens   the suite's sections (parent side, and the write / open child tasks)
"""
