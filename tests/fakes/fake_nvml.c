/*
 * A fake libnvidia-ml.so.1 for tests: it stands in for the NVIDIA driver's NVML library where no GPU exists.
 *
 * Written against the real nvml.h (PyPI package nvidia-nvml-dev), so the real nvidia-ml-py ctypes bindings call
 * it exactly as they call the driver. Behaviour comes from a scenario file named by FAKE_NVML_SCENARIO, re-read
 * whenever it changes, so a test can move values over time, lose a GPU, or raise XID events mid-run:
 *
 *   init_error CODE                    nvmlInitWithFlags returns CODE (e.g. 9: driver not loaded)
 *   device_count N
 *   hang FUNCTION MS                   FUNCTION sleeps MS milliseconds before answering
 *   gpu I name TEXT...                 static facts: name, uuid
 *   gpu I KEY VALUE                    a reading (keys below)
 *   gpu I unsupported FUNCTION         FUNCTION returns NVML_ERROR_NOT_SUPPORTED for this GPU
 *   gpu I error FUNCTION CODE          FUNCTION returns CODE for this GPU
 *   gpu I lost 1                       every call on this GPU returns NVML_ERROR_GPU_IS_LOST
 *   gpu I proc PID USED_BYTES SM_UTIL [GI]  a compute process (SM_UTIL < 0: no utilisation sample), on MIG GPU
 *                                      instance GI of a GPU with MIG on
 *   gpu I xid SEQ CODE                 an XID event, delivered once by nvmlEventSetWait_v2
 *   gpu I field ID VALUE [TYPE]        a field value (nvmlDeviceGetFieldValues), of value type TYPE: d (double),
 *                                      ui, ul, ull (the default), sll, si, us (nvmlValueType_t)
 *   gpu I nvlinks N                    links 0..N-1 are active (nvmlDeviceGetNvLinkState; a link past N is an
 *                                      invalid argument); without it the GPU has no NVLink (not supported)
 *   gpu I nvlinks_down MASK            the links whose bit is set in MASK are not active (NVML_FEATURE_DISABLED)
 *   gpu I nvlink_error LINK COUNTER V  an NVLink error counter (nvmlNvLinkErrorCounter_t COUNTER) of a link; a
 *                                      counter not given is not supported on that link
 *   gpu I gpm METRIC_ID VALUE          a GPM metric (nvmlGpmMetricsGet); gpm_supported 1 enables GPM
 *   gpu I mig SLOT J                   MIG device SLOT of GPU I is the device described as "gpu J" (J beyond
 *                                      device_count: its uuid, memory_*, gpu_instance); max_mig sets the slots
 *
 * Built twice by the tests: as a current driver, and with -DOLD_DRIVER, which leaves out the symbols an old
 * driver lacks (compute processes v3, remapped rows, GPM, memory info v2), to test "function not found".
 *
 * Like the driver, it counts nvmlInit/nvmlShutdown and answers NVML_ERROR_UNINITIALIZED to a call while not
 * initialised. It also keeps the books a test needs to judge teardown, read with fake_nvml_stat(NAME):
 *   init_refcount, calls_uninitialized (calls while not initialised), live_event_sets (created, not freed),
 *   waits_in_flight, freed_while_waiting, shutdown_while_waiting, waits_on_freed_set, sets_live_at_shutdown
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nvml.h"

#define MAX_GPUS 16
#define MAX_LIST 64
#define API __attribute__((visibility("default")))

enum key {
    K_MEMORY_TOTAL, K_MEMORY_USED, K_MEMORY_FREE, K_MEMORY_RESERVED, K_UTIL_GPU, K_UTIL_MEM, K_ENC_UTIL, K_DEC_UTIL,
    K_TEMP, K_POWER_MW, K_POWER_LIMIT_MW, K_ENERGY_MJ, K_CLOCK_SM, K_CLOCK_MEM, K_MAX_CLOCK_SM, K_MAX_CLOCK_MEM,
    K_PSTATE, K_FAN, K_CLOCK_REASONS, K_VIOL_POWER_NS, K_VIOL_THERMAL_NS, K_VIOL_SYNC_BOOST_NS, K_VIOL_BOARD_NS,
    K_VIOL_LOW_UTIL_NS, K_VIOL_RELIABILITY_NS, K_PCIE_TX_KBPS, K_PCIE_RX_KBPS, K_PCIE_REPLAY, K_ECC_CORR_VOLATILE,
    K_ECC_UNC_VOLATILE, K_ECC_CORR_AGGREGATE, K_ECC_UNC_AGGREGATE, K_REMAP_CORR, K_REMAP_UNC, K_REMAP_PENDING,
    K_REMAP_FAILURE, K_MIG_MODE, K_LOST, K_GPM_SUPPORTED, K_GPU_INSTANCE, K_MAX_MIG, K_NVLINKS, K_NVLINKS_DOWN, K_COUNT
};
static const char *KEY_NAMES[K_COUNT] = {
    "memory_total", "memory_used", "memory_free", "memory_reserved", "util_gpu", "util_mem", "enc_util", "dec_util",
    "temp", "power_mw", "power_limit_mw", "energy_mj", "clock_sm", "clock_mem", "max_clock_sm", "max_clock_mem",
    "pstate", "fan", "clock_reasons", "violation_power_ns", "violation_thermal_ns", "violation_sync_boost_ns",
    "violation_board_limit_ns", "violation_low_util_ns", "violation_reliability_ns", "pcie_tx_kbps", "pcie_rx_kbps",
    "pcie_replay", "ecc_corr_volatile", "ecc_unc_volatile", "ecc_corr_aggregate", "ecc_unc_aggregate", "remap_corr",
    "remap_unc", "remap_pending", "remap_failure", "mig_mode", "lost", "gpm_supported", "gpu_instance", "max_mig",
    "nvlinks", "nvlinks_down",
};

struct named_code { char fn[64]; int code; };
struct proc { unsigned int pid; unsigned long long used; int sm; unsigned int gi; };
struct pair { unsigned long long id; double value; };
struct field { unsigned int id; nvmlValueType_t type; nvmlValue_t value; };
struct event_set {
    int freed;
    int waiters;
    struct gpu *registered[MAX_GPUS]; int n_registered;
};

struct gpu {
    unsigned int index;
    char name[96];
    char uuid[96];
    long long v[K_COUNT];
    int has[K_COUNT];
    struct named_code errors[MAX_LIST]; int n_errors;
    struct proc procs[MAX_LIST]; int n_procs;
    struct pair xids[MAX_LIST]; int n_xids;  /* id = sequence number, value = XID code */
    struct field fields[MAX_LIST]; int n_fields;
    struct pair nvlink_errors[MAX_LIST]; int n_nvlink_errors;  /* id = link * 16 + counter */
    struct pair gpm[MAX_LIST]; int n_gpm;
    struct pair migs[MAX_LIST]; int n_migs;  /* id = slot, value = index of the MIG device's struct */
};

static struct gpu gpus[MAX_GPUS];
static int n_gpus;
static int init_error;
static struct named_code hangs[MAX_LIST]; static int n_hangs;
static time_t loaded_mtime; static long loaded_mtime_ns; static off_t loaded_size;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long calls;
static unsigned long long delivered_xid[MAX_GPUS];  /* highest sequence number delivered per GPU */

/* The teardown books (see the top); read and written with atomics, from any thread. */
static long long init_refcount, calls_uninitialized, live_event_sets, waits_in_flight, freed_while_waiting,
    shutdown_while_waiting, waits_on_freed_set, sets_live_at_shutdown;
#define BUMP(X, N) __atomic_add_fetch(&(X), (N), __ATOMIC_SEQ_CST)
#define LOAD(X) __atomic_load_n(&(X), __ATOMIC_SEQ_CST)

API unsigned long long fake_nvml_call_count(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }
API long long fake_nvml_stat(const char *name) {
    static const struct { const char *name; long long *value; } stats[] = {
        {"init_refcount", &init_refcount}, {"calls_uninitialized", &calls_uninitialized},
        {"live_event_sets", &live_event_sets}, {"waits_in_flight", &waits_in_flight},
        {"freed_while_waiting", &freed_while_waiting}, {"shutdown_while_waiting", &shutdown_while_waiting},
        {"waits_on_freed_set", &waits_on_freed_set}, {"sets_live_at_shutdown", &sets_live_at_shutdown},
    };
    for (size_t i = 0; i < sizeof stats / sizeof stats[0]; i++)
        if (!strcmp(stats[i].name, name)) return LOAD(*stats[i].value);
    return -1;
}

/* Every call but init: NVML_ERROR_UNINITIALIZED (and counted) while the library is not initialised. */
static int uninitialized(void) {
    if (LOAD(init_refcount) > 0) return 0;
    BUMP(calls_uninitialized, 1);
    return 1;
}

static int parse_value_type(const char *text, nvmlValueType_t *type) {
    static const char *names[] = {"d", "ui", "ul", "ull", "sll", "si", "us"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(text, names[i])) { *type = (nvmlValueType_t)i; return 1; }
    return 0;
}

static void set_field(struct field *f, const char *num, nvmlValueType_t type) {
    f->type = type;
    switch (type) {
    case NVML_VALUE_TYPE_DOUBLE: f->value.dVal = strtod(num, NULL); break;
    case NVML_VALUE_TYPE_UNSIGNED_INT: f->value.uiVal = (unsigned int)strtoul(num, NULL, 0); break;
    case NVML_VALUE_TYPE_UNSIGNED_LONG: f->value.ulVal = strtoul(num, NULL, 0); break;
    case NVML_VALUE_TYPE_SIGNED_LONG_LONG: f->value.sllVal = strtoll(num, NULL, 0); break;
    case NVML_VALUE_TYPE_SIGNED_INT: f->value.siVal = (int)strtol(num, NULL, 0); break;
    case NVML_VALUE_TYPE_UNSIGNED_SHORT: f->value.usVal = (unsigned short)strtoul(num, NULL, 0); break;
    default: f->value.ullVal = strtoull(num, NULL, 0); break;
    }
}

static void parse(FILE *f) {
    char line[512];
    memset(gpus, 0, sizeof gpus);
    n_gpus = 0; init_error = 0; n_hangs = 0;
    for (int i = 0; i < MAX_GPUS; i++) gpus[i].index = (unsigned int)i;
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char w1[64] = "", w2[64] = "", w3[64] = "", rest[400] = "";
        int idx;
        if (sscanf(line, "init_error %d", &init_error) == 1) continue;
        if (sscanf(line, "device_count %d", &n_gpus) == 1) { if (n_gpus > MAX_GPUS) n_gpus = MAX_GPUS; continue; }
        if (sscanf(line, "hang %63s %63s", w1, w2) == 2 && n_hangs < MAX_LIST) {
            snprintf(hangs[n_hangs].fn, sizeof hangs[n_hangs].fn, "%s", w1);
            hangs[n_hangs++].code = atoi(w2);
            continue;
        }
        if (sscanf(line, "gpu %d %63s", &idx, w1) != 2 || idx < 0 || idx >= MAX_GPUS) continue;
        struct gpu *g = &gpus[idx];
        if (!strcmp(w1, "name") || !strcmp(w1, "uuid")) {
            if (sscanf(line, "gpu %*d %*s %399[^\n]", rest) == 1) {
                size_t n = strlen(rest);
                while (n && (rest[n - 1] == ' ' || rest[n - 1] == '\r')) rest[--n] = 0;
                snprintf(!strcmp(w1, "name") ? g->name : g->uuid, 96, "%s", rest);
            }
        } else if (!strcmp(w1, "unsupported") && sscanf(line, "gpu %*d %*s %63s", w2) == 1 && g->n_errors < MAX_LIST) {
            snprintf(g->errors[g->n_errors].fn, 64, "%s", w2);
            g->errors[g->n_errors++].code = NVML_ERROR_NOT_SUPPORTED;
        } else if (!strcmp(w1, "error") && sscanf(line, "gpu %*d %*s %63s %63s", w2, w3) == 2 && g->n_errors < MAX_LIST) {
            snprintf(g->errors[g->n_errors].fn, 64, "%s", w2);
            g->errors[g->n_errors++].code = atoi(w3);
        } else if (!strcmp(w1, "proc") && g->n_procs < MAX_LIST) {
            struct proc *p = &g->procs[g->n_procs];
            p->gi = 0xFFFFFFFF;
            if (sscanf(line, "gpu %*d %*s %u %llu %d %u", &p->pid, &p->used, &p->sm, &p->gi) >= 3) g->n_procs++;
        } else if (!strcmp(w1, "field") && g->n_fields < MAX_LIST) {
            struct field *fv = &g->fields[g->n_fields];
            char num[64] = "", type[16] = "ull";
            nvmlValueType_t vt = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            int n = sscanf(line, "gpu %*d %*s %u %63s %15s", &fv->id, num, type);
            if (n >= 2 && parse_value_type(type, &vt)) { set_field(fv, num, vt); g->n_fields++; }
        } else if (!strcmp(w1, "nvlink_error") && g->n_nvlink_errors < MAX_LIST) {
            unsigned int link, counter; double v;
            if (sscanf(line, "gpu %*d %*s %u %u %lf", &link, &counter, &v) == 3) {
                g->nvlink_errors[g->n_nvlink_errors].id = link * 16ULL + counter;
                g->nvlink_errors[g->n_nvlink_errors++].value = v;
            }
        } else if ((!strcmp(w1, "xid") || !strcmp(w1, "gpm") || !strcmp(w1, "mig"))) {
            struct pair *list = !strcmp(w1, "xid") ? g->xids : !strcmp(w1, "gpm") ? g->gpm : g->migs;
            int *n = !strcmp(w1, "xid") ? &g->n_xids : !strcmp(w1, "gpm") ? &g->n_gpm : &g->n_migs;
            if (*n < MAX_LIST && sscanf(line, "gpu %*d %*s %llu %lf", &list[*n].id, &list[*n].value) == 2) (*n)++;
        } else {
            for (int k = 0; k < K_COUNT; k++) {
                if (!strcmp(w1, KEY_NAMES[k])) {
                    char num[64];
                    if (sscanf(line, "gpu %*d %*s %63s", num) == 1) {
                        g->v[k] = strtoll(num, NULL, 0);
                        g->has[k] = 1;
                    }
                }
            }
        }
    }
}

/* Re-read the scenario when its file changed; called under the lock. */
static void reload(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    if (st.st_mtim.tv_sec == loaded_mtime && st.st_mtim.tv_nsec == loaded_mtime_ns && st.st_size == loaded_size)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    parse(f);
    fclose(f);
    loaded_mtime = st.st_mtim.tv_sec; loaded_mtime_ns = st.st_mtim.tv_nsec; loaded_size = st.st_size;
}

static void maybe_hang(const char *fn) {
    for (int i = 0; i < n_hangs; i++)
        if (!strcmp(hangs[i].fn, fn)) usleep((useconds_t)hangs[i].code * 1000);
}

/* Common entry of every device call: the GPU, or an error code for it. */
static nvmlReturn_t enter(const char *fn, nvmlDevice_t device, struct gpu **out) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    *out = NULL;
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    int hang_ms = 0;
    pthread_mutex_lock(&lock);
    reload();
    for (int i = 0; i < n_hangs; i++) if (!strcmp(hangs[i].fn, fn)) hang_ms = hangs[i].code;
    struct gpu *g = (struct gpu *)device;
    nvmlReturn_t ret = NVML_SUCCESS;
    if (!g || g < gpus || g >= gpus + MAX_GPUS) ret = NVML_ERROR_INVALID_ARGUMENT;  /* MIG devices lie beyond n_gpus */
    else if (g->has[K_LOST] && g->v[K_LOST]) ret = NVML_ERROR_GPU_IS_LOST;
    else {
        for (int i = 0; i < g->n_errors; i++)
            if (!strcmp(g->errors[i].fn, fn)) { ret = (nvmlReturn_t)g->errors[i].code; break; }
    }
    pthread_mutex_unlock(&lock);
    if (hang_ms) usleep((useconds_t)hang_ms * 1000);
    *out = g;
    return ret;
}

/* A reading: NOT_SUPPORTED when the scenario does not give it. */
#define READ(KEY, FN, DEV, EXPR)                                   \
    struct gpu *g;                                                 \
    nvmlReturn_t r = enter(FN, DEV, &g);                           \
    if (r != NVML_SUCCESS) return r;                               \
    if (!g->has[KEY]) return NVML_ERROR_NOT_SUPPORTED;             \
    EXPR;                                                          \
    return NVML_SUCCESS

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    reload();
    int err = init_error;
    pthread_mutex_unlock(&lock);
    maybe_hang("nvmlInitWithFlags");
    if (err == NVML_SUCCESS) BUMP(init_refcount, 1);
    return (nvmlReturn_t)err;
}
API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlShutdown(void) {
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    if (LOAD(waits_in_flight) > 0) BUMP(shutdown_while_waiting, 1);
    if (BUMP(init_refcount, -1) == 0) BUMP(sets_live_at_shutdown, LOAD(live_event_sets));
    return NVML_SUCCESS;
}
API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    default: return "Unknown Error";
    }
}
API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    snprintf(version, length, "%s", "580.00.fake");
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&lock);
    reload();
    *count = (unsigned int)n_gpus;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&lock);
    reload();
    int n = n_gpus;
    int lost = index < (unsigned int)n && gpus[index].has[K_LOST] && gpus[index].v[K_LOST];
    pthread_mutex_unlock(&lock);
    if (index >= (unsigned int)n) return NVML_ERROR_INVALID_ARGUMENT;
    if (lost) return NVML_ERROR_GPU_IS_LOST;  /* as the driver answers for a GPU fallen off the bus */
    *device = (nvmlDevice_t)&gpus[index];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    struct gpu *g; nvmlReturn_t r = enter("nvmlDeviceGetIndex", device, &g);
    if (r == NVML_SUCCESS) *index = g->index;
    return r;
}
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct gpu *g; nvmlReturn_t r = enter("nvmlDeviceGetName", device, &g);
    if (r != NVML_SUCCESS) return r;
    if (strlen(g->name) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(name, length, "%s", g->name);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct gpu *g; nvmlReturn_t r = enter("nvmlDeviceGetUUID", device, &g);
    if (r != NVML_SUCCESS) return r;
    if (strlen(g->uuid) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, length, "%s", g->uuid);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m) {
    READ(K_MEMORY_TOTAL, "nvmlDeviceGetMemoryInfo", device,
         (m->total = (unsigned long long)g->v[K_MEMORY_TOTAL], m->used = (unsigned long long)g->v[K_MEMORY_USED],
          m->free = (unsigned long long)g->v[K_MEMORY_FREE]));
}
#ifndef OLD_DRIVER
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m) {
    READ(K_MEMORY_TOTAL, "nvmlDeviceGetMemoryInfo_v2", device,
         (m->total = (unsigned long long)g->v[K_MEMORY_TOTAL], m->used = (unsigned long long)g->v[K_MEMORY_USED],
          m->free = (unsigned long long)g->v[K_MEMORY_FREE],
          m->reserved = (unsigned long long)g->v[K_MEMORY_RESERVED]));
}
#endif
API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    READ(K_UTIL_GPU, "nvmlDeviceGetUtilizationRates", device,
         (u->gpu = (unsigned int)g->v[K_UTIL_GPU], u->memory = (unsigned int)g->v[K_UTIL_MEM]));
}
API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *u, unsigned int *period) {
    READ(K_ENC_UTIL, "nvmlDeviceGetEncoderUtilization", device, (*u = (unsigned int)g->v[K_ENC_UTIL], *period = 1000000));
}
API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *u, unsigned int *period) {
    READ(K_DEC_UTIL, "nvmlDeviceGetDecoderUtilization", device, (*u = (unsigned int)g->v[K_DEC_UTIL], *period = 1000000));
}
API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor, unsigned int *t) {
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    READ(K_TEMP, "nvmlDeviceGetTemperature", device, *t = (unsigned int)g->v[K_TEMP]);
}
API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *p) {
    READ(K_POWER_MW, "nvmlDeviceGetPowerUsage", device, *p = (unsigned int)g->v[K_POWER_MW]);
}
API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *p) {
    READ(K_POWER_LIMIT_MW, "nvmlDeviceGetEnforcedPowerLimit", device, *p = (unsigned int)g->v[K_POWER_LIMIT_MW]);
}
API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *e) {
    READ(K_ENERGY_MJ, "nvmlDeviceGetTotalEnergyConsumption", device, *e = (unsigned long long)g->v[K_ENERGY_MJ]);
}
API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *c) {
    int k = type == NVML_CLOCK_SM ? K_CLOCK_SM : type == NVML_CLOCK_MEM ? K_CLOCK_MEM : -1;
    if (k < 0) return NVML_ERROR_NOT_SUPPORTED;
    READ(k, "nvmlDeviceGetClockInfo", device, *c = (unsigned int)g->v[k]);
}
API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *c) {
    int k = type == NVML_CLOCK_SM ? K_MAX_CLOCK_SM : type == NVML_CLOCK_MEM ? K_MAX_CLOCK_MEM : -1;
    if (k < 0) return NVML_ERROR_NOT_SUPPORTED;
    READ(k, "nvmlDeviceGetMaxClockInfo", device, *c = (unsigned int)g->v[k]);
}
API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *p) {
    READ(K_PSTATE, "nvmlDeviceGetPerformanceState", device, *p = (nvmlPstates_t)g->v[K_PSTATE]);
}
API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *s) {
    READ(K_FAN, "nvmlDeviceGetFanSpeed", device, *s = (unsigned int)g->v[K_FAN]);
}
API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    READ(K_CLOCK_REASONS, "nvmlDeviceGetCurrentClocksEventReasons", device,
         *reasons = (unsigned long long)g->v[K_CLOCK_REASONS]);
}
API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}
API nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t policy, nvmlViolationTime_t *t) {
    int k;
    switch (policy) {
    case NVML_PERF_POLICY_POWER: k = K_VIOL_POWER_NS; break;
    case NVML_PERF_POLICY_THERMAL: k = K_VIOL_THERMAL_NS; break;
    case NVML_PERF_POLICY_SYNC_BOOST: k = K_VIOL_SYNC_BOOST_NS; break;
    case NVML_PERF_POLICY_BOARD_LIMIT: k = K_VIOL_BOARD_NS; break;
    case NVML_PERF_POLICY_LOW_UTILIZATION: k = K_VIOL_LOW_UTIL_NS; break;
    case NVML_PERF_POLICY_RELIABILITY: k = K_VIOL_RELIABILITY_NS; break;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    READ(k, "nvmlDeviceGetViolationStatus", device,
         (t->referenceTime = 0, t->violationTime = (unsigned long long)g->v[k]));
}
API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *v) {
    int k = counter == NVML_PCIE_UTIL_TX_BYTES ? K_PCIE_TX_KBPS : K_PCIE_RX_KBPS;
    READ(k, "nvmlDeviceGetPcieThroughput", device, *v = (unsigned int)g->v[k]);
}
API nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *v) {
    READ(K_PCIE_REPLAY, "nvmlDeviceGetPcieReplayCounter", device, *v = (unsigned int)g->v[K_PCIE_REPLAY]);
}
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t type, nvmlEccCounterType_t counter,
                                             unsigned long long *count) {
    int corrected = type == NVML_MEMORY_ERROR_TYPE_CORRECTED;
    int k = counter == NVML_VOLATILE_ECC ? (corrected ? K_ECC_CORR_VOLATILE : K_ECC_UNC_VOLATILE)
                                         : (corrected ? K_ECC_CORR_AGGREGATE : K_ECC_UNC_AGGREGATE);
    READ(k, "nvmlDeviceGetTotalEccErrors", device, *count = (unsigned long long)g->v[k]);
}
#ifndef OLD_DRIVER
API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr, unsigned int *unc,
                                           unsigned int *pending, unsigned int *failure) {
    READ(K_REMAP_CORR, "nvmlDeviceGetRemappedRows", device,
         (*corr = (unsigned int)g->v[K_REMAP_CORR], *unc = (unsigned int)g->v[K_REMAP_UNC],
          *pending = (unsigned int)g->v[K_REMAP_PENDING], *failure = (unsigned int)g->v[K_REMAP_FAILURE]));
}
#endif
API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    READ(K_MAX_MIG, "nvmlDeviceGetMaxMigDeviceCount", device, *count = (unsigned int)g->v[K_MAX_MIG]);
}
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig) {
    struct gpu *g;
    nvmlReturn_t r = enter("nvmlDeviceGetMigDeviceHandleByIndex", device, &g);
    if (r != NVML_SUCCESS) return r;
    for (int i = 0; i < g->n_migs; i++) {
        int target = (int)g->migs[i].value;
        if (g->migs[i].id == index && target >= 0 && target < MAX_GPUS) {
            *mig = (nvmlDevice_t)&gpus[target];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;  /* an empty slot */
}
API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    READ(K_GPU_INSTANCE, "nvmlDeviceGetGpuInstanceId", device, *id = (unsigned int)g->v[K_GPU_INSTANCE]);
}
API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    READ(K_MIG_MODE, "nvmlDeviceGetMigMode", device,
         (*current = (unsigned int)g->v[K_MIG_MODE], *pending = (unsigned int)g->v[K_MIG_MODE]));
}

/* Compute processes: the two-call protocol (size first), in both struct versions. */
#define PROCS(FN, TYPE)                                                                  \
    API nvmlReturn_t FN(nvmlDevice_t device, unsigned int *count, TYPE *infos) {        \
        struct gpu *g;                                                                  \
        nvmlReturn_t r = enter(#FN, device, &g);                                        \
        if (r != NVML_SUCCESS) return r;                                                \
        if (g->n_procs == 0) { *count = 0; return NVML_SUCCESS; }                       \
        if (!infos || *count < (unsigned int)g->n_procs) {                              \
            *count = (unsigned int)g->n_procs;                                          \
            return NVML_ERROR_INSUFFICIENT_SIZE;                                        \
        }                                                                               \
        for (int i = 0; i < g->n_procs; i++) {                                          \
            memset(&infos[i], 0, sizeof infos[i]);                                      \
            infos[i].pid = g->procs[i].pid;                                             \
            infos[i].usedGpuMemory = g->procs[i].used;                                  \
            infos[i].gpuInstanceId = g->procs[i].gi;                                    \
            infos[i].computeInstanceId = 0xFFFFFFFF;                                    \
        }                                                                               \
        *count = (unsigned int)g->n_procs;                                              \
        return NVML_SUCCESS;                                                            \
    }
#ifndef OLD_DRIVER
PROCS(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
#endif
PROCS(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t)

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                                 unsigned int *count, unsigned long long since) {
    struct gpu *g;
    nvmlReturn_t r = enter("nvmlDeviceGetProcessUtilization", device, &g);
    if (r != NVML_SUCCESS) return r;
    int n = 0;
    for (int i = 0; i < g->n_procs; i++) if (g->procs[i].sm >= 0) n++;
    if (n == 0) return NVML_ERROR_NOT_FOUND;  /* what the driver says when no sample is newer than `since` */
    if (!samples || *count < (unsigned int)n) { *count = (unsigned int)n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    int j = 0;
    for (int i = 0; i < g->n_procs; i++) {
        if (g->procs[i].sm < 0) continue;
        samples[j].pid = g->procs[i].pid;
        samples[j].timeStamp = since + 1;
        samples[j].smUtil = (unsigned int)g->procs[i].sm;
        samples[j].memUtil = 0; samples[j].encUtil = 0; samples[j].decUtil = 0;
        j++;
    }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    struct gpu *g;
    nvmlReturn_t r = enter("nvmlDeviceGetFieldValues", device, &g);
    if (r != NVML_SUCCESS) return r;
    for (int i = 0; i < count; i++) {
        values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        for (int j = 0; j < g->n_fields; j++) {
            if (g->fields[j].id == values[i].fieldId) {
                values[i].nvmlReturn = NVML_SUCCESS;
                values[i].valueType = g->fields[j].type;
                values[i].value = g->fields[j].value;
            }
        }
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *active) {
    READ(K_NVLINKS, "nvmlDeviceGetNvLinkState", device, ({
        if (link >= (unsigned int)g->v[K_NVLINKS]) return NVML_ERROR_INVALID_ARGUMENT;
        *active = ((unsigned long long)g->v[K_NVLINKS_DOWN] >> link) & 1 ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    }));
}
API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                 nvmlNvLinkErrorCounter_t counter, unsigned long long *value) {
    READ(K_NVLINKS, "nvmlDeviceGetNvLinkErrorCounter", device, ({
        if (link >= (unsigned int)g->v[K_NVLINKS]) return NVML_ERROR_INVALID_ARGUMENT;
        int found = 0;
        for (int i = 0; i < g->n_nvlink_errors; i++)
            if (g->nvlink_errors[i].id == link * 16ULL + (unsigned)counter) {
                *value = (unsigned long long)g->nvlink_errors[i].value;
                found = 1;
            }
        if (!found) return NVML_ERROR_NOT_SUPPORTED;
    }));
}

/* Events: each set is its own object (never released, so a use after free is seen, not undefined);
 * nvmlEventSetWait_v2 hands out scenario XIDs of the set's GPUs in sequence order, once each. */
API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    struct event_set *es = calloc(1, sizeof *es);
    if (!es) return NVML_ERROR_MEMORY;
    BUMP(live_event_sets, 1);
    *set = (nvmlEventSet_t)es;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    struct event_set *es = (struct event_set *)set;
    if (!es || __atomic_exchange_n(&es->freed, 1, __ATOMIC_SEQ_CST)) return NVML_ERROR_INVALID_ARGUMENT;
    if (LOAD(es->waiters) > 0) BUMP(freed_while_waiting, 1);
    BUMP(live_event_sets, -1);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    struct gpu *g; nvmlReturn_t r = enter("nvmlDeviceGetSupportedEventTypes", device, &g);
    if (r == NVML_SUCCESS) *types = nvmlEventTypeXidCriticalError;
    return r;
}
API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    struct gpu *g; nvmlReturn_t r = enter("nvmlDeviceRegisterEvents", device, &g);
    if (r != NVML_SUCCESS) return r;
    struct event_set *es = (struct event_set *)set;
    if (!es || LOAD(es->freed)) return NVML_ERROR_INVALID_ARGUMENT;
    if (!(types & nvmlEventTypeXidCriticalError)) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    int known = 0;
    for (int i = 0; i < es->n_registered; i++) known |= es->registered[i] == g;
    if (!known && es->n_registered < MAX_GPUS) es->registered[es->n_registered++] = g;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}
static nvmlReturn_t wait_for_event(struct event_set *es, nvmlEventData_t *data, unsigned int timeoutms) {
    maybe_hang("nvmlEventSetWait_v2");
    for (unsigned int waited = 0;; waited += 10) {
        if (LOAD(es->freed)) { BUMP(waits_on_freed_set, 1); return NVML_ERROR_INVALID_ARGUMENT; }
        pthread_mutex_lock(&lock);
        reload();
        for (int i = 0; i < es->n_registered; i++) {
            struct gpu *g = es->registered[i];
            if (g->has[K_LOST] && g->v[K_LOST]) { pthread_mutex_unlock(&lock); return NVML_ERROR_GPU_IS_LOST; }
            struct pair *next = NULL;
            for (int j = 0; j < g->n_xids; j++)
                if (g->xids[j].id > delivered_xid[g->index] && (!next || g->xids[j].id < next->id)) next = &g->xids[j];
            if (next) {
                delivered_xid[g->index] = next->id;
                memset(data, 0, sizeof *data);
                data->device = (nvmlDevice_t)g;
                data->eventType = nvmlEventTypeXidCriticalError;
                data->eventData = (unsigned long long)next->value;
                data->gpuInstanceId = 0xFFFFFFFF;
                data->computeInstanceId = 0xFFFFFFFF;
                pthread_mutex_unlock(&lock);
                return NVML_SUCCESS;
            }
        }
        pthread_mutex_unlock(&lock);
        if (waited >= timeoutms) return NVML_ERROR_TIMEOUT;
        usleep(10000);
    }
}
API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    struct event_set *es = (struct event_set *)set;
    if (!es) return NVML_ERROR_INVALID_ARGUMENT;
    BUMP(waits_in_flight, 1);
    BUMP(es->waiters, 1);
    nvmlReturn_t r = wait_for_event(es, data, timeoutms);
    BUMP(es->waiters, -1);
    BUMP(waits_in_flight, -1);
    return r;
}

#ifndef OLD_DRIVER
/* GPM: a sample is a timestamp; metrics come from the scenario. */
struct fake_sample { struct gpu *g; int taken; };
API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    struct gpu *g; nvmlReturn_t r = enter("nvmlGpmQueryDeviceSupport", device, &g);
    if (r != NVML_SUCCESS) return r;
    support->isSupportedDevice = g->has[K_GPM_SUPPORTED] && g->v[K_GPM_SUPPORTED];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    *sample = (nvmlGpmSample_t)calloc(1, sizeof(struct fake_sample));
    return *sample ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}
API nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    free(sample);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    struct gpu *g; nvmlReturn_t r = enter("nvmlGpmSampleGet", device, &g);
    if (r != NVML_SUCCESS) return r;
    if (!(g->has[K_GPM_SUPPORTED] && g->v[K_GPM_SUPPORTED])) return NVML_ERROR_NOT_SUPPORTED;
    ((struct fake_sample *)sample)->g = g;
    ((struct fake_sample *)sample)->taken = 1;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (uninitialized()) return NVML_ERROR_UNINITIALIZED;
    struct fake_sample *a = (struct fake_sample *)m->sample1, *b = (struct fake_sample *)m->sample2;
    if (!a || !b || !a->taken || !b->taken) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        m->metrics[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        for (int j = 0; j < b->g->n_gpm; j++) {
            if (b->g->gpm[j].id == m->metrics[i].metricId) {
                m->metrics[i].nvmlReturn = NVML_SUCCESS;
                m->metrics[i].value = b->g->gpm[j].value;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}
#endif
