# Native fault codes and the one place they become datasetrt's typed errors.
#
# Every kernel module (gather.pyx, table.pyx, codec.pyx, batch.pyx) reports a failure from its `nogil`
# code as one of these codes and raises it, with a message naming what failed, through `raise_fault`
# (cf. pyarrow's check_status). The code decides the class from datasetrt.errors; each class also
# subclasses the builtin users catch (ValueError, RuntimeError, MemoryError, IndexError, TypeError).
# An OS error outside a gather (mapped.pyx: open, fstat, mmap) is `CacheIOError.from_os` directly.

cdef enum Fault:
    F_OK = 0
    F_OUT_FULL = 1        # flow control of the gather loop, not a fault
    F_SAMPLE_RANGE = 2    # SampleIndexError
    F_SHARD_ID = 3        # CacheFormatError
    F_BOUNDS = 4          # CacheIOError
    F_IO = 5              # CacheIOError
    F_SHORT_READ = 6      # CacheIOError
    F_CHECKSUM = 7        # IntegrityError
    F_ENVELOPE = 8        # CacheFormatError
    F_DECODE = 9          # CacheFormatError: a stored payload does not decode as its codec says
    F_DECODED_LIMIT = 10  # CacheFormatError
    F_NOT_OPEN = 11       # CacheIOError
    F_NOMEM = 12          # ResourceLimitError
    F_CODEC = 13          # CacheFormatError: a codec id the kernels do not know
    F_UTF8 = 14           # RecordJSONError
    F_ENCODE = 15         # CodecError: the codec library failed on a payload it accepted
    F_INPUT_LIMIT = 16    # SourceError: a payload larger than its codec can store
    F_LEVEL = 17          # ConfigError: a level the codec library does not have
    F_ARGUMENT = 18       # ConfigError: arguments that break a kernel's documented contract
    F_TYPE = 19           # ArgumentTypeError
    F_STATE = 20          # CacheFormatError: a record and its cache's codec state (zstd_dict dictionary) disagree,
                          # or the state itself is not one the codec can load
    F_PAYLOAD_SPEC = 21   # CacheFormatError: a stored payload whose length does not fit the cache's PayloadSpec


cdef inline int raise_fault(int code, str message, object os_errno=None, object path=None) except -1:
    """Raise the typed error of fault `code` with `message` (which names the path/sample/value).
    A CacheIOError also carries `os_errno` (the OS error number, for F_IO) and `path` (the file it
    concerns), so callers react to a kind of failure by `exc.errno`, never by its text."""
    from datasetrt import errors

    if code == F_SAMPLE_RANGE:
        cls = errors.SampleIndexError
    elif code == F_BOUNDS or code == F_IO or code == F_SHORT_READ or code == F_NOT_OPEN:
        cls = errors.CacheIOError
    elif code == F_CHECKSUM:
        cls = errors.IntegrityError
    elif code == F_UTF8:
        cls = errors.RecordJSONError
    elif code == F_NOMEM:
        cls = errors.ResourceLimitError
    elif code == F_ENCODE:
        cls = errors.CodecError
    elif code == F_INPUT_LIMIT:
        cls = errors.SourceError
    elif code == F_LEVEL or code == F_ARGUMENT:
        cls = errors.ConfigError
    elif code == F_TYPE:
        cls = errors.ArgumentTypeError
    else:  # F_SHARD_ID, F_ENVELOPE, F_DECODE, F_DECODED_LIMIT, F_CODEC, F_STATE, F_PAYLOAD_SPEC and anything unforeseen
        cls = errors.CacheFormatError
    if cls is errors.CacheIOError:
        raise cls(message, errno=os_errno, path=path)
    raise cls(message)
