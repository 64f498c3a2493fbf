// A CUDA timeline for processes we cannot profile otherwise (there is no
// Nsight Systems on the lent machine): loaded by the CUDA driver through
// CUDA_INJECTION64_PATH, it records every kernel, copy, memset,
// synchronisation and driver/runtime API call with CUPTI's activity API and
// writes them as CSV at exit to $CUPTI_TRACE_OUT (default cupti_trace.csv).
// The first line pairs CUPTI's clock with CLOCK_REALTIME so that markers a
// process prints in wall-clock time can be placed on the timeline
// (timeline.py). Built on the GPU machine by device_prefill_timeline.sh,
// which passes the header's newest record types as KERNEL_T / MEMCPY_T /
// MEMSET_T / SYNC_T.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BUF_SIZE (8 * 1024 * 1024)

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = (uint8_t *)aligned_alloc(8, BUF_SIZE);
  *size = BUF_SIZE;
  *max_records = 0;
}

static void write_api(const char *domain, CUpti_CallbackDomain d, const CUpti_ActivityAPI *a) {
  const char *name = NULL;
  if (cuptiGetCallbackName(d, a->cbid, &name) != CUPTI_SUCCESS || !name) name = "?";
  fprintf(out, "%s,%s,%llu,%llu,%u,%u\n", domain, name, (unsigned long long)a->start,
          (unsigned long long)a->end, a->threadId, a->correlationId);
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
  CUpti_Activity *rec = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const KERNEL_T *k = (const KERNEL_T *)rec;
        // Kernel names may hold commas (templates): keep the CSV whole.
        char name[512];
        snprintf(name, sizeof name, "%s", k->name ? k->name : "?");
        for (char *c = name; *c; c++)
          if (*c == ',') *c = ';';
        fprintf(out, "kernel,%s,%llu,%llu,%u,%u\n", name, (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->correlationId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const MEMCPY_T *m = (const MEMCPY_T *)rec;
        fprintf(out, "memcpy,kind%u_%llub,%llu,%llu,%u,%u\n", (unsigned)m->copyKind,
                (unsigned long long)m->bytes, (unsigned long long)m->start, (unsigned long long)m->end,
                m->streamId, m->correlationId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const MEMSET_T *m = (const MEMSET_T *)rec;
        fprintf(out, "memset,%llub,%llu,%llu,%u,%u\n", (unsigned long long)m->bytes,
                (unsigned long long)m->start, (unsigned long long)m->end, m->streamId, m->correlationId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
        const SYNC_T *s = (const SYNC_T *)rec;
        fprintf(out, "sync,type%u,%llu,%llu,%u,%u\n", (unsigned)s->type, (unsigned long long)s->start,
                (unsigned long long)s->end, s->streamId, s->correlationId);
        break;
      }
      case CUPTI_ACTIVITY_KIND_DRIVER:
        write_api("driver", CUPTI_CB_DOMAIN_DRIVER_API, (const CUpti_ActivityAPI *)rec);
        break;
      case CUPTI_ACTIVITY_KIND_RUNTIME:
        write_api("runtime", CUPTI_CB_DOMAIN_RUNTIME_API, (const CUpti_ActivityAPI *)rec);
        break;
      default:
        break;
    }
  }
  free(buffer);
}

static void flush_at_exit(void) {
  cuptiActivityFlushAll(1);
  if (out) fclose(out);
  out = NULL;
}

int InitializeInjection(void) {
  const char *path = getenv("CUPTI_TRACE_OUT");
  out = fopen(path ? path : "cupti_trace.csv", "w");
  if (!out) return 0;
  uint64_t cupti_now = 0;
  cuptiGetTimestamp(&cupti_now);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  fprintf(out, "clock,cupti_ns=%llu,realtime_ns=%llu,0,0,0\n", (unsigned long long)cupti_now,
          (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
  atexit(flush_at_exit);
  return 1;
}
