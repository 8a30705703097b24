/* specdeploy's NCCL tuner plugin (interface v5, loaded by NCCL 2.28): per-size algorithm/protocol choice from the CSV that
 * `specdeploy nccl choose --tuner-csv` writes. Build against NCCL's tuner plugin header (tuner.h with its
 * common.h and err.h, from an NCCL source tree: plugins/tuner/example/nccl/), see build.sh.
 *
 * CSV rows: colltype,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff
 * (-1 = any; '#' starts a comment). The file is NCCL_TUNER_CONFIG_FILE. The first row whose collective,
 * byte range, node and rank counts match wins; its algorithm/protocol entry in NCCL's cost table is set to 0,
 * so NCCL takes it unless NCCL marked that pair unusable. No match: NCCL's own choice stands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tuner.h"

#define MAX_ROWS 256

struct row {
  int coll;
  size_t lo, hi;
  int algo, proto, channels, nodes, ranks;
};

struct ctx {
  size_t nRanks, nNodes;
  ncclDebugLogger_t log;
  int n;
  struct row rows[MAX_ROWS];
};

static int lookup(const char* s, const char* const* names, const int* values, int count) {
  for (int i = 0; i < count; i++)
    if (strcasecmp(s, names[i]) == 0) return values[i];
  return -2;
}

static int parse_coll(const char* s) {
  static const char* const n[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
  static const int v[] = {ncclFuncBroadcast, ncclFuncReduce, ncclFuncAllGather, ncclFuncReduceScatter,
                          ncclFuncAllReduce};
  return lookup(s, n, v, 5);
}

static int parse_algo(const char* s) {
  static const char* const n[] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"};
  static const int v[] = {NCCL_ALGO_TREE, NCCL_ALGO_RING, NCCL_ALGO_COLLNET_DIRECT, NCCL_ALGO_COLLNET_CHAIN,
                          NCCL_ALGO_NVLS, NCCL_ALGO_NVLS_TREE, NCCL_ALGO_PAT};
  return lookup(s, n, v, 7);
}

static int parse_proto(const char* s) {
  static const char* const n[] = {"ll", "ll128", "simple"};
  static const int v[] = {NCCL_PROTO_LL, NCCL_PROTO_LL128, NCCL_PROTO_SIMPLE};
  return lookup(s, n, v, 3);
}

static void load(struct ctx* c, const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) {
    if (c->log) c->log(NCCL_LOG_WARN, NCCL_TUNING, __FILE__, __LINE__, "specdeploy tuner: cannot open %s", path);
    return;
  }
  char line[512];
  int lineno = 0;
  while (fgets(line, sizeof line, f) && c->n < MAX_ROWS) {
    lineno++;
    char* p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '#' || *p == '\n' || *p == '\0') continue;
    char* field[10];
    int k = 0;
    for (char* tok = strtok(p, ",\n"); tok && k < 10; tok = strtok(NULL, ",\n")) field[k++] = tok;
    struct row r;
    if (k < 8 || (r.coll = parse_coll(field[0])) < 0 || (r.algo = parse_algo(field[3])) < 0 ||
        (r.proto = parse_proto(field[4])) < 0) {
      if (c->log) c->log(NCCL_LOG_WARN, NCCL_TUNING, __FILE__, __LINE__,
                         "specdeploy tuner: %s line %d ignored (not coll,min,max,algo,proto,channels,nodes,ranks)",
                         path, lineno);
      continue;
    }
    r.lo = strtoull(field[1], NULL, 10);
    r.hi = strtoull(field[2], NULL, 10);
    r.channels = atoi(field[5]);
    r.nodes = atoi(field[6]);
    r.ranks = atoi(field[7]);
    c->rows[c->n++] = r;
  }
  fclose(f);
}

static ncclResult_t sd_init(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                            ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                            ncclTunerConstants_v5_t* constants) {
  (void)commId;
  (void)nvlDomainInfo;
  (void)constants; /* NCCL's model constants stay as they are */
  struct ctx* c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  c->nRanks = nRanks;
  c->nNodes = nNodes;
  c->log = logFunction;
  const char* path = getenv("NCCL_TUNER_CONFIG_FILE");
  if (path) load(c, path);
  if (c->log) c->log(NCCL_LOG_INFO, NCCL_TUNING, __FILE__, __LINE__, "specdeploy tuner: %d rows from %s", c->n,
                     path ? path : "(NCCL_TUNER_CONFIG_FILE unset)");
  *context = c;
  return ncclSuccess;
}

static ncclResult_t sd_get_coll_info(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                     float** collCostTable, int numAlgo, int numProto, int regBuff,
                                     int* nChannels) {
  (void)numPipeOps;
  (void)regBuff;
  struct ctx* c = context;
  float(*table)[NCCL_NUM_PROTOCOLS] = (float(*)[NCCL_NUM_PROTOCOLS])collCostTable;
  for (int i = 0; i < c->n; i++) {
    const struct row* r = &c->rows[i];
    if (r->coll != (int)collType || nBytes < r->lo || nBytes > r->hi) continue;
    if ((r->nodes != -1 && (size_t)r->nodes != c->nNodes) || (r->ranks != -1 && (size_t)r->ranks != c->nRanks))
      continue;
    if (r->algo >= numAlgo || r->proto >= numProto || table[r->algo][r->proto] == NCCL_ALGO_PROTO_IGNORE)
      return ncclSuccess; /* NCCL cannot run that pair here: its own choice stands */
    table[r->algo][r->proto] = 0.0f;
    if (r->channels > 0) *nChannels = r->channels;
    return ncclSuccess;
  }
  return ncclSuccess;
}

static ncclResult_t sd_destroy(void* context) {
  free(context);
  return ncclSuccess;
}

const ncclTuner_v5_t ncclTunerPlugin_v5 = {
    .name = "specdeploy",
    .init = sd_init,
    .getCollInfo = sd_get_coll_info,
    .finalize = sd_destroy,
};
