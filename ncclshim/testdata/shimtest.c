// shimtest drives libgoep_nccl.so through NCCL's C API as an NCCL program
// would, its ranks threads of one process on goep's host backend
// (GOEP_NCCL_BACKEND=host). TestCProgram (shim_test.go) builds and runs it:
//
//   shimtest fake     GOEP_NCCL is the host-memory NCCL stand-in and
//                     GOEP_NCCL_PLANS holds a 2-rank allreduce plan
//   shimtest nonccl   GOEP_NCCL names a missing file
//
// It prints "FAIL ..." lines and exits 1 on a wrong result or code, and
// prints "ok" at the end otherwise. Declarations are written here, from
// NCCL's documented API, as a program would get them from nccl.h.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ncclComm *ncclComm_t;
typedef struct {
	char internal[128];
} ncclUniqueId;
typedef struct {
	size_t size;
	unsigned int magic, version;
	int blocking, cgaClusterSize, minCTAs, maxCTAs;
	const char *netName;
	int splitShare;
} ncclConfig_t;
enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };
enum { ncclInt32 = 2, ncclFloat32 = 7 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2 };

int ncclGetVersion(int *);
int ncclGetUniqueId(ncclUniqueId *);
int ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
int ncclCommInitRankConfig(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
int ncclCommInitAll(ncclComm_t *, int, const int *);
int ncclCommFinalize(ncclComm_t);
int ncclCommDestroy(ncclComm_t);
int ncclCommCount(ncclComm_t, int *);
int ncclCommUserRank(ncclComm_t, int *);
int ncclCommCuDevice(ncclComm_t, int *);
int ncclCommGetAsyncError(ncclComm_t, int *);
int ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, void *);
int ncclAllGather(const void *, void *, size_t, int, ncclComm_t, void *);
int ncclReduceScatter(const void *, void *, size_t, int, int, ncclComm_t, void *);
int ncclBroadcast(const void *, void *, size_t, int, int, ncclComm_t, void *);
int ncclReduce(const void *, void *, size_t, int, int, int, ncclComm_t, void *);
int ncclSend(const void *, size_t, int, int, ncclComm_t, void *);
int ncclRecv(void *, size_t, int, int, ncclComm_t, void *);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclMemAlloc(void **, size_t);
int ncclMemFree(void *);
int ncclCommRegister(ncclComm_t, void *, size_t, void **);
int ncclCommDeregister(ncclComm_t, void *);
int ncclCommSplit(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
int ncclAlltoAll(const void *, void *, size_t, int, ncclComm_t, void *);
int ncclRedOpDestroy(int, ncclComm_t);
const char *ncclGetErrorString(int);
const char *ncclGetLastError(ncclComm_t);
int goepNcclCommCounts(ncclComm_t, int64_t *, int);

#define W 2
#define N 1000
enum { K_AR, K_AG, K_RS, K_BC, K_RED, K_SEND, K_RECV };
enum { P_PLAN, P_NATIVE, P_NCCL, P_STAGED };

static ncclUniqueId id;
static int fake; // mode
static int failures;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

#define CHECK(cond, ...)                                        \
	do {                                                        \
		if (!(cond)) {                                          \
			pthread_mutex_lock(&mu);                            \
			printf("FAIL rank %d line %d: ", rank, __LINE__);   \
			printf(__VA_ARGS__);                                \
			printf("\n");                                       \
			failures++;                                         \
			pthread_mutex_unlock(&mu);                          \
		}                                                       \
	} while (0)
#define CALL(expr) CHECK((rc = (expr)) == ncclSuccess, "%s = %d (%s): %s", #expr, rc, ncclGetErrorString(rc), ncclGetLastError(NULL))

static float v(int rank, int i) { return (float)((rank + 1) * ((i % 13) + 1)); }

static void *run(void *arg) {
	int rank = (int)(intptr_t)arg, rc, x;
	ncclComm_t comm = NULL;
	ncclConfig_t cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.size = sizeof cfg;
	cfg.magic = 0xcafebeef;
	cfg.version = 22105;
	cfg.blocking = 1;
	CALL(ncclCommInitRankConfig(&comm, W, id, rank, &cfg));
	if (comm == NULL) return NULL;
	CALL(ncclCommCount(comm, &x));
	CHECK(x == W, "count %d", x);
	CALL(ncclCommUserRank(comm, &x));
	CHECK(x == rank, "user rank %d", x);
	CALL(ncclCommCuDevice(comm, &x));

	float *send = calloc(W * N, sizeof(float)), *recv = calloc(W * N, sizeof(float));
	for (int i = 0; i < W * N; i++) send[i] = v(rank, i);

	// Native: allreduce (sum), allgather, reduce-scatter (max).
	CALL(ncclAllReduce(send, recv, N, ncclFloat32, ncclSum, comm, NULL));
	for (int i = 0; i < N; i++) CHECK(recv[i] == v(0, i) + v(1, i), "allreduce [%d] = %g", i, recv[i]);
	CALL(ncclAllGather(send, recv, N, ncclFloat32, comm, NULL));
	for (int r = 0; r < W; r++)
		for (int i = 0; i < N; i++) CHECK(recv[r * N + i] == v(r, i), "allgather [%d][%d] = %g", r, i, recv[r * N + i]);
	// An int32 allgather moves bytes natively too.
	CALL(ncclAllGather(send, recv, N, ncclInt32, comm, NULL));
	for (int r = 0; r < W; r++) CHECK(recv[r * N + 7] == v(r, 7), "int32 allgather [%d] = %g", r, recv[r * N + 7]);
	CALL(ncclReduceScatter(send, recv, N, ncclFloat32, ncclMax, comm, NULL));
	for (int i = 0; i < N; i++) CHECK(recv[i] == v(1, rank * N + i), "reduce-scatter [%d] = %g", i, recv[i]);

	// Broadcast from rank 1 (NCCL, or the staged path).
	CALL(ncclBroadcast(send, recv, N, ncclFloat32, 1, comm, NULL));
	for (int i = 0; i < N; i++) CHECK(recv[i] == v(1, i), "broadcast [%d] = %g", i, recv[i]);

	// Send/recv: 0 -> 1, then both ways in one group.
	memset(recv, 0, N * sizeof(float));
	if (rank == 0) CALL(ncclSend(send, N, ncclFloat32, 1, comm, NULL));
	if (rank == 1) {
		CALL(ncclRecv(recv, N, ncclFloat32, 0, comm, NULL));
		for (int i = 0; i < N; i++) CHECK(recv[i] == v(0, i), "recv [%d] = %g", i, recv[i]);
	}
	memset(recv, 0, N * sizeof(float));
	CALL(ncclGroupStart());
	CALL(ncclRecv(recv, N, ncclFloat32, 1 - rank, comm, NULL)); // the receive first: the group orders it
	CALL(ncclSend(send, N, ncclFloat32, 1 - rank, comm, NULL));
	CALL(ncclGroupEnd());
	for (int i = 0; i < N; i++) CHECK(recv[i] == v(1 - rank, i), "group recv [%d] = %g", i, recv[i]);

	// Plans first: an in-place allreduce matches the registered plan.
	memcpy(recv, send, N * sizeof(float));
	CALL(ncclAllReduce(recv, recv, N, ncclFloat32, ncclSum, comm, NULL));
	for (int i = 0; i < N; i++) CHECK(recv[i] == v(0, i) + v(1, i), "plan allreduce [%d] = %g", i, recv[i]);

	// Prod has no native algorithm: NCCL (the stand-in), or an error
	// naming the missing library.
	rc = ncclAllReduce(send, recv, N, ncclFloat32, ncclProd, comm, NULL);
	if (fake) {
		CHECK(rc == ncclSuccess, "prod allreduce = %d: %s", rc, ncclGetLastError(comm));
		for (int i = 0; i < N; i++) CHECK(recv[i] == v(0, i) * v(1, i), "prod allreduce [%d] = %g", i, recv[i]);
	} else {
		CHECK(rc == ncclInvalidUsage, "prod allreduce without NCCL = %d", rc);
		CHECK(strstr(ncclGetLastError(comm), "/nonexistent/libnccl.so.2") != NULL, "last error: %s", ncclGetLastError(comm));
	}

	// Bad input: NCCL's codes, nothing issued.
	CHECK(ncclAllReduce(NULL, recv, N, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidArgument, "NULL sendbuff");
	CHECK(ncclAllReduce(send, recv, N, 99, ncclSum, comm, NULL) == ncclInvalidArgument, "bad datatype");
	CHECK(ncclAllReduce(send, recv, N, ncclFloat32, 17, comm, NULL) == ncclInvalidArgument, "bad op");
	CHECK(ncclBroadcast(send, recv, N, ncclFloat32, W, comm, NULL) == ncclInvalidArgument, "root out of range");
	CHECK(ncclSend(send, N, ncclFloat32, -1, comm, NULL) == ncclInvalidArgument, "peer out of range");
	CHECK(ncclAllGather(send, recv, SIZE_MAX / 2, ncclFloat32, comm, NULL) == ncclInvalidArgument, "count overflow");
	CHECK(ncclAllReduce(send, recv, N, ncclFloat32, ncclSum, NULL, NULL) == ncclInvalidArgument, "NULL comm");
	CHECK(ncclAllReduce(send, recv, N, ncclFloat32, ncclSum, (ncclComm_t)send, NULL) == ncclInvalidArgument, "foreign comm");
	CHECK(ncclRedOpDestroy(5, comm) == ncclInvalidUsage, "ncclRedOpDestroy is not supported");
	CHECK(strstr(ncclGetLastError(comm), "ncclRedOpDestroy") != NULL, "last error names the call: %s", ncclGetLastError(comm));
	// NCCL 2.28's all-to-all goes to NCCL: the stand-in lacks it, and
	// without NCCL it cannot run.
	CHECK(ncclAlltoAll(send, recv, N, ncclFloat32, comm, NULL) == ncclInvalidUsage, "ncclAlltoAll without it");
	CHECK(strstr(ncclGetLastError(comm), fake ? "lacks it" : "/nonexistent/libnccl.so.2") != NULL, "last error: %s",
	      ncclGetLastError(comm));

	// Split: one color with the ranks reversed by key, then one rank alone.
	ncclComm_t sub = NULL;
	CALL(ncclCommSplit(comm, 0, 1 - rank, &sub, NULL));
	if (sub != NULL) {
		CALL(ncclCommUserRank(sub, &x));
		CHECK(x == 1 - rank, "split rank %d", x);
		CALL(ncclAllReduce(send, recv, N, ncclFloat32, ncclSum, sub, NULL));
		for (int i = 0; i < N; i++) CHECK(recv[i] == v(0, i) + v(1, i), "split allreduce [%d] = %g", i, recv[i]);
		CALL(ncclCommDestroy(sub));
	}
	sub = comm;
	CALL(ncclCommSplit(comm, rank == 0 ? 7 : -1, 0, &sub, NULL));
	CHECK((sub != NULL) == (rank == 0), "NCCL_SPLIT_NOCOLOR gives NULL, a color a communicator");
	if (sub != NULL) {
		CALL(ncclCommCount(sub, &x));
		CHECK(x == 1, "alone: count %d", x);
		CALL(ncclAllReduce(send, recv, N, ncclFloat32, ncclProd, sub, NULL));
		for (int i = 0; i < N; i++) CHECK(recv[i] == v(0, i), "one-rank allreduce [%d] = %g", i, recv[i]);
		CALL(ncclCommDestroy(sub));
	}
	CALL(ncclCommGetAsyncError(comm, &x));
	CHECK(x == ncclSuccess, "async error %d", x);

	// Memory and registration.
	void *mem = NULL, *h = NULL;
	CALL(ncclMemAlloc(&mem, 1 << 20));
	CHECK(mem != NULL, "ncclMemAlloc gave NULL");
	CALL(ncclCommRegister(comm, mem, 1 << 20, &h));
	CALL(ncclCommDeregister(comm, h));
	CALL(ncclMemFree(mem));
	CHECK(ncclMemFree(send) == ncclInvalidArgument, "ncclMemFree of foreign memory");

	// Where each call went.
	int64_t counts[7 * 4];
	memset(counts, 0xff, sizeof counts);
	CALL(goepNcclCommCounts(comm, counts, 7 * 4));
	CHECK(counts[K_AR * 4 + P_NATIVE] == 1, "native allreduces %lld", (long long)counts[K_AR * 4 + P_NATIVE]);
	CHECK(counts[K_AR * 4 + P_PLAN] == 1, "plan allreduces %lld", (long long)counts[K_AR * 4 + P_PLAN]);
	CHECK(counts[K_AR * 4 + P_NCCL] == fake, "NCCL allreduces %lld", (long long)counts[K_AR * 4 + P_NCCL]);
	CHECK(counts[K_AG * 4 + P_NATIVE] == 2, "native allgathers %lld", (long long)counts[K_AG * 4 + P_NATIVE]);
	CHECK(counts[K_RS * 4 + P_NATIVE] == 1, "native reduce-scatters %lld", (long long)counts[K_RS * 4 + P_NATIVE]);
	CHECK(counts[K_BC * 4 + P_STAGED] == 1, "staged broadcasts %lld", (long long)counts[K_BC * 4 + P_STAGED]);
	CHECK(counts[K_SEND * 4 + P_STAGED] + counts[K_RECV * 4 + P_STAGED] == 3, "staged p2p %lld+%lld",
	      (long long)counts[K_SEND * 4 + P_STAGED], (long long)counts[K_RECV * 4 + P_STAGED]);

	CALL(ncclCommFinalize(comm));
	CALL(ncclCommDestroy(comm));
	free(send);
	free(recv);
	return NULL;
}

// initAll checks ncclCommInitAll: one thread drives both ranks, so their
// allreduce must be one group.
static void initAll(void) {
	int rank = -1, rc;
	ncclComm_t comms[W];
	float *buf[W];
	CALL(ncclCommInitAll(comms, W, NULL));
	if (rc != ncclSuccess) return;
	CALL(ncclGroupStart());
	for (int r = 0; r < W; r++) {
		buf[r] = calloc(N, sizeof(float));
		for (int i = 0; i < N; i++) buf[r][i] = v(r, i);
		CALL(ncclAllReduce(buf[r], buf[r], N, ncclFloat32, ncclMax, comms[r], NULL));
	}
	CALL(ncclGroupEnd());
	for (int r = 0; r < W; r++) {
		for (int i = 0; i < N; i++) CHECK(buf[r][i] == v(1, i), "initAll allreduce [%d][%d] = %g", r, i, buf[r][i]);
		free(buf[r]);
	}
	for (int r = 0; r < W; r++) CALL(ncclCommDestroy(comms[r]));
}

int main(int argc, char **argv) {
	int rank = -1, rc, version = 0;
	pthread_t th[W];
	fake = argc > 1 && strcmp(argv[1], "fake") == 0;
	CALL(ncclGetVersion(&version));
	CHECK(version >= 21000, "version %d", version);
	CHECK(ncclGetUniqueId(NULL) == ncclInvalidArgument, "NULL id");
	CALL(ncclGetUniqueId(&id));
	for (int r = 0; r < W; r++) pthread_create(&th[r], NULL, run, (void *)(intptr_t)r);
	for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
	initAll();
	if (failures > 0) {
		printf("%d failures\n", failures);
		return 1;
	}
	printf("ok\n");
	return 0;
}
