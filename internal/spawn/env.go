package spawn

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"strconv"
	"strings"
)

// Variables inherited from the launcher's own environment that would make
// bootstrap.FromEnv in the children look somewhere else than we point it.
var dropInherited = map[string]bool{
	"GOEP_MASTER_ADDR":             true,
	"GOEP_MASTER_PORT":             true,
	"GOEP_UNIQUE_ID":               true,
	"TORCHELASTIC_USE_AGENT_STORE": true, // would shift the root port
}

// childEnv builds rank's environment: the launcher's (less dropInherited),
// then extra, then the launcher's own variables, later entries winning.
// CUDA_VISIBLE_DEVICES is deliberately not set: ranks choose their GPU by
// LOCAL_RANK and must see every GPU to enable peer access.
func childEnv(base, extra []string, rank, n, port int, runID string) []string {
	ours := []string{
		"RANK=" + strconv.Itoa(rank),
		"WORLD_SIZE=" + strconv.Itoa(n),
		"LOCAL_RANK=" + strconv.Itoa(rank),
		"LOCAL_WORLD_SIZE=" + strconv.Itoa(n),
		"MASTER_ADDR=127.0.0.1",
		"MASTER_PORT=" + strconv.Itoa(port),
		"GOEP_RUN_ID=" + runID,
		"NCCL_NVLS_ENABLE=0", // we never use NVLink multicast
	}
	var env []string
	index := map[string]int{}
	add := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			env[i] = kv
			return
		}
		index[k] = len(env)
		env = append(env, kv)
	}
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); !dropInherited[k] {
			add(kv)
		}
	}
	for _, kv := range extra {
		add(kv)
	}
	for _, kv := range ours {
		add(kv)
	}
	return env
}

// freePort asks the kernel for a free loopback port. Another process could
// take it before rank 0 binds it; rank 0 then fails with a clear error.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func newRunID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
