/* How the batch gather should read uncompressed records (docs/architecture.md, "Batches").
 *
 * Writes a shard of n records (u64 json_len | 40-byte JSON | payload) to /tmp/zcbench/shard.bin,
 * then reads it as batches of 256 with each mechanism, payloads back to back in one buffer:
 *   inplace+memmove          one pread per run of neighbouring records (one per record when
 *                            shuffled) straight into the batch buffer, XXH3 of each record, then
 *                            each payload moved down over its own header and JSON (what
 *                            _ext/gather.pyx gather_batch does);
 *   preadv hdr|dst           preadv with [header+JSON -> scratch, payload -> its final place] per
 *                            record (needs the JSON length before the read: dense specs only),
 *                            XXH3 streamed over the two pieces;
 *   inplace no move (today)  the record gather of per-sample reads (JSON between payloads).
 * Prints the best of 15 passes in records per CPU second (CLOCK_PROCESS_CPUTIME_ID: the machine
 * is shared, so wall time mostly measures the other tenants).
 *   gcc -O2 -o /tmp/gm benchmarks/gather_mechanisms.c && /tmp/gm PAYLOAD_BYTES N SHUFFLE(0|1) VERIFY(0|1)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/uio.h>
#include <time.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

static double now(void){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
/* records: u64 jlen | json | payload */
int main(int argc,char**argv){
  size_t plen=atol(argv[1]); int n=atoi(argv[2]); int shuffle=atoi(argv[3]); int verify=atoi(argv[4]);
  size_t jl=40, rl=8+jl+plen;
  const char*path="/tmp/gather_mechanisms_shard.bin";
  FILE*f=fopen(path,"wb"); char*rec=malloc(rl); memset(rec,'x',rl); uint64_t j=jl; memcpy(rec,&j,8);
  for(int i=0;i<n;i++){ for(size_t k=8+jl;k<rl;k+=64) rec[k]=(char)(i+k); fwrite(rec,1,rl,f);} fclose(f);
  int fd=open(path,O_RDONLY);
  uint64_t*off=malloc(8*n); uint64_t*sum=malloc(8*n); int*order=malloc(sizeof(int)*n);
  for(int i=0;i<n;i++){off[i]=(uint64_t)i*rl; order[i]=i;}
  srand(1); if(shuffle) for(int i=n-1;i>0;i--){int k=rand()%(i+1);int t=order[i];order[i]=order[k];order[k]=t;}
  { char*b=malloc(rl); for(int i=0;i<n;i++){pread(fd,b,rl,off[i]); sum[i]=XXH3_64bits(b,rl);} free(b);}
  int B=256; size_t cap=(size_t)B*rl+4096; uint8_t*out=aligned_alloc(4096,(cap+4095)/4096*4096); memset(out,0,cap);
  uint8_t hdr[4096]; struct iovec iov[1024];
  XXH3_state_t*st=XXH3_createState();
  const char*names[]={"inplace+memmove","preadv hdr|dst","inplace no move (today)"};
  for(int m=0;m<3;m++){
   double best=1e9;
   for(int rep=0;rep<15;rep++){
    double t0=now(); uint64_t bad=0;
    for(int b0=0;b0<n;b0+=B){
      int cnt = n-b0<B? n-b0:B; size_t pos=0;
      if(m==0||m==2){
        int i=0;
        while(i<cnt){
          int r=order[b0+i]; int e=i+1;
          if(!shuffle){ while(e<cnt && order[b0+e]==order[b0+e-1]+1 && (e-i)<4096) e++; }
          size_t tot=(size_t)(e-i)*rl; /* read span in place at pos */
          pread(fd,out+pos,tot,off[r]);
          uint8_t*src=out+pos;
          for(int k=i;k<e;k++){ uint8_t*rr=src+(size_t)(k-i)*rl; 
             if(verify && XXH3_64bits(rr,rl)!=sum[order[b0+k]]) bad++;
             uint64_t jj; memcpy(&jj,rr,8);
             if(m==0){ memmove(out+pos, rr+8+jj, plen); pos+=plen; } else pos+=rl; }
          i=e;
        }
      } else {
        int i=0;
        while(i<cnt){
          int e=i+1; if(!shuffle){ while(e<cnt && order[b0+e]==order[b0+e-1]+1 && (e-i)<512) e++; }
          int r=order[b0+i];
          for(int k=i;k<e;k++){ iov[2*(k-i)].iov_base=hdr+((k-i)%64)*0; iov[2*(k-i)].iov_len=8+jl; iov[2*(k-i)+1].iov_base=out+pos+(size_t)(k-i)*plen; iov[2*(k-i)+1].iov_len=plen; }
          /* note: headers overwrite same scratch; verify needs per-record header: use distinct scratch */
          for(int k=i;k<e;k++) iov[2*(k-i)].iov_base=hdr+ ((k-i)%(4096/(8+jl)))*(8+jl);
          preadv(fd,iov,2*(e-i),off[r]);
          if(verify) for(int k=i;k<e;k++){ XXH3_64bits_reset(st); XXH3_64bits_update(st,iov[2*(k-i)].iov_base,8+jl); XXH3_64bits_update(st,out+pos+(size_t)(k-i)*plen,plen); if(XXH3_64bits_digest(st)!=sum[order[b0+k]]) bad++; }
          pos+=(size_t)(e-i)*plen; i=e;
        }
      }
    }
    double dt=now()-t0; if(dt<best)best=dt; if(bad && m!=1) {printf("bad %lu\n",bad);} 
   }
   printf("plen=%zu n=%d shuffle=%d verify=%d %-26s %8.0f krec/s %7.0f MiB/s\n",plen,n,shuffle,verify,names[m],n/best/1e3,n*(double)plen/best/1048576);
  }
  return 0;
}
