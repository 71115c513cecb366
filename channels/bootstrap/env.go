package bootstrap

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EnvInfo is what a launcher told this process about the job.
type EnvInfo struct {
	Rank, Size           int
	LocalRank, LocalSize int // position among the ranks of this host
	MasterAddr           string
	MasterPort           int
	Launcher             string // "torchrun", "mpirun", "slurm" or "none"
	// Enclosing names a launcher whose variables are set too and that is
	// taken to run this one: "mpirun" when torchrun runs under mpirun (its
	// world a multiple of mpirun's), "slurm" inside a Slurm allocation or
	// step. Empty when no other launcher's variables are set.
	Enclosing string

	// RootPort is the port rank 0 listens on for the bootstrap:
	// $GOEP_MASTER_PORT if set; MasterPort+1 under a torchrun whose agent
	// already serves its own store on MasterPort
	// (TORCHELASTIC_USE_AGENT_STORE=True); otherwise MasterPort.
	RootPort int
	// RunID tells runs with the same master address apart: $GOEP_RUN_ID, or
	// what the launcher provides (torchrun run id and restart count, Slurm
	// job and step). Used to derive the unique id.
	RunID string
	// UniqueID is $GOEP_UNIQUE_ID, a shared id set by the user; empty means
	// ConnectFromEnv derives one.
	UniqueID string
	// ListenHost is $GOEP_LISTEN_HOST (see Config.ListenHost).
	ListenHost string
}

// Environment variables read besides the launchers' own.
const (
	EnvMasterAddr = "GOEP_MASTER_ADDR" // overrides MASTER_ADDR
	EnvMasterPort = "GOEP_MASTER_PORT" // sets RootPort directly
	EnvRunID      = "GOEP_RUN_ID"
	EnvUniqueID   = "GOEP_UNIQUE_ID"
	EnvListenHost = "GOEP_LISTEN_HOST"
	// EnvLauncher names the launcher whose variables to follow (torchrun,
	// mpirun, slurm, or none for a single process) when several launchers'
	// variables are set on purpose.
	EnvLauncher = "GOEP_LAUNCHER"
)

// FromEnv reads the rank layout from the launcher's environment variables:
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID, ...),
// checked in that order because torchrun may run under srun or mpirun, and
// mpirun inside a Slurm allocation ($GOEP_LAUNCHER picks one explicitly).
// When torchrun's and Open MPI's variables are both set they must agree, or
// torchrun's world must be a multiple of mpirun's (torchrun started by
// mpirun); anything else is refused as a contradiction (stale variables),
// naming both. Slurm's variables are present in any allocation, batch
// script included, so they never contradict: Slurm is then the Enclosing
// launcher. Open MPI and Slurm provide no rendezvous
// address, so MASTER_ADDR and MASTER_PORT must be set for them when there is
// more than one rank. Without any launcher variables the process is rank 0
// of 1 with Launcher "none". When a launcher gives no local rank/size, the
// job is assumed to run on one host (LocalRank = Rank, LocalSize = Size).
func FromEnv() (EnvInfo, error) {
	return fromEnv(os.LookupEnv)
}

// env reads variables through a lookup function so tests need not touch the
// process environment.
type env struct {
	lookup   func(string) (string, bool)
	launcher string
}

func (e env) has(k string) bool {
	v, ok := e.lookup(k)
	return ok && strings.TrimSpace(v) != ""
}

func (e env) str(k string) string {
	v, _ := e.lookup(k)
	return strings.TrimSpace(v)
}

func (e env) errorf(format string, args ...any) error {
	return fmt.Errorf("bootstrap: %s environment: "+format, append([]any{e.launcher}, args...)...)
}

// count parses a non-negative integer variable.
func (e env) count(k string) (int, error) {
	v := e.str(k)
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, e.errorf("%s=%q is not an integer", k, v)
	}
	if n < 0 {
		return 0, e.errorf("%s=%q is negative", k, v)
	}
	return n, nil
}

// pair reads an index/count pair such as RANK/WORLD_SIZE; both or neither
// must be set. ok is false when neither is.
func (e env) pair(idxKey, cntKey string) (idx, cnt int, ok bool, err error) {
	hi, hc := e.has(idxKey), e.has(cntKey)
	switch {
	case !hi && !hc:
		return 0, 0, false, nil
	case !hc:
		return 0, 0, false, e.errorf("%s=%q is set but %s is not", idxKey, e.str(idxKey), cntKey)
	case !hi:
		return 0, 0, false, e.errorf("%s=%q is set but %s is not", cntKey, e.str(cntKey), idxKey)
	}
	if idx, err = e.count(idxKey); err != nil {
		return
	}
	if cnt, err = e.count(cntKey); err != nil {
		return
	}
	if cnt == 0 {
		return 0, 0, false, e.errorf("%s=0; it must be at least 1", cntKey)
	}
	if idx >= cnt {
		return 0, 0, false, e.errorf("%s=%d is not less than %s=%d", idxKey, idx, cntKey, cnt)
	}
	return idx, cnt, true, nil
}

func (e env) port(k string) (int, error) {
	v := e.str(k)
	p, err := strconv.Atoi(v)
	if err != nil || p < 1 || p > 65535 {
		return 0, e.errorf("%s=%q is not a port number in [1, 65535]", k, v)
	}
	return p, nil
}

// launchers in the order FromEnv prefers them, with the variables that
// show each one is present.
var launchers = []struct {
	name string
	vars []string
}{
	{"torchrun", []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}},
	{"mpirun", []string{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}},
	{"slurm", []string{"SLURM_PROCID"}},
}

// present lists the launchers whose variables are set, in preference order.
func (e env) present() []string {
	var out []string
	for _, l := range launchers {
		for _, v := range l.vars {
			if e.has(v) {
				out = append(out, l.name)
				break
			}
		}
	}
	return out
}

// read fills info from launcher l's variables.
func (e env) read(l string, info *EnvInfo) error {
	e.launcher = l
	switch l {
	case "torchrun":
		return e.torchrun(info)
	case "mpirun":
		return e.mpirun(info)
	}
	return e.slurm(info)
}

// choose picks the launcher to follow and the enclosing one, refusing
// torchrun and Open MPI variables that contradict each other.
func (e env) choose() (launcher, enclosing string, err error) {
	found := e.present()
	if want := e.str(EnvLauncher); want != "" {
		switch {
		case want == "none":
			return "none", "", nil
		case !slices.Contains([]string{"torchrun", "mpirun", "slurm"}, want):
			return "", "", fmt.Errorf("bootstrap: %s=%q: want torchrun, mpirun, slurm or none", EnvLauncher, clipEnv(want))
		case !slices.Contains(found, want):
			return "", "", fmt.Errorf("bootstrap: %s=%s but no %s variables are set", EnvLauncher, want, want)
		}
		return want, "", nil
	}
	if len(found) == 0 {
		return "none", "", nil
	}
	launcher = found[0]
	if len(found) == 1 {
		return launcher, "", nil
	}
	if launcher == "torchrun" && found[1] == "mpirun" {
		var t, m EnvInfo
		if err := e.read("torchrun", &t); err != nil {
			return "", "", err
		}
		if err := e.read("mpirun", &m); err != nil {
			return "", "", err
		}
		switch {
		case t.Size == m.Size && t.Rank == m.Rank:
			// The same job seen twice (e.g. variables exported for both).
		case t.Size > m.Size && t.Size%m.Size == 0:
			return launcher, "mpirun", nil
		default:
			return "", "", fmt.Errorf("bootstrap: launcher variables disagree: torchrun's say rank %d of %d (RANK, WORLD_SIZE), "+
				"Open MPI's rank %d of %d (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE); unset the stale ones, or set %s "+
				"to the launcher to follow", t.Rank, t.Size, m.Rank, m.Size, EnvLauncher)
		}
		if len(found) == 2 {
			return launcher, "", nil
		}
	}
	return launcher, found[len(found)-1], nil
}

// clipEnv bounds a variable's value repeated in an error.
func clipEnv(v string) string {
	if len(v) > 64 {
		return v[:64] + "..."
	}
	return v
}

func fromEnv(lookup func(string) (string, bool)) (EnvInfo, error) {
	e := env{lookup: lookup}
	var info EnvInfo
	launcher, enclosing, err := e.choose()
	if err != nil {
		return EnvInfo{}, err
	}
	if launcher == "none" {
		return EnvInfo{Size: 1, LocalSize: 1, Launcher: "none"}, nil
	}
	e.launcher = launcher
	info.Enclosing = enclosing
	err = e.read(launcher, &info)
	if err != nil {
		return EnvInfo{}, err
	}
	info.Launcher = e.launcher
	if info.LocalSize > info.Size {
		return EnvInfo{}, e.errorf("local size %d exceeds world size %d", info.LocalSize, info.Size)
	}
	if err := e.master(&info); err != nil {
		return EnvInfo{}, err
	}
	if id := e.str(EnvUniqueID); id != "" {
		if err := validateUniqueID(id); err != nil {
			return EnvInfo{}, e.errorf("%s: %w", EnvUniqueID, err)
		}
		info.UniqueID = id
	}
	info.ListenHost = e.str(EnvListenHost)
	if info.RunID = e.str(EnvRunID); info.RunID == "" {
		info.RunID = e.launcherRunID()
	}
	return info, nil
}

// local fills LocalRank/LocalSize from a pair of variables, defaulting to a
// single host when the launcher gives neither.
func (e env) local(info *EnvInfo, idxKey, cntKey string) error {
	lr, ls, ok, err := e.pair(idxKey, cntKey)
	if err != nil {
		return err
	}
	if !ok {
		lr, ls = info.Rank, info.Size
	}
	info.LocalRank, info.LocalSize = lr, ls
	return nil
}

func (e env) torchrun(info *EnvInfo) error {
	r, s, ok, err := e.pair("RANK", "WORLD_SIZE")
	if err != nil {
		return err
	}
	if !ok {
		return e.errorf("LOCAL_RANK or LOCAL_WORLD_SIZE is set but RANK and WORLD_SIZE are not")
	}
	info.Rank, info.Size = r, s
	return e.local(info, "LOCAL_RANK", "LOCAL_WORLD_SIZE")
}

func (e env) mpirun(info *EnvInfo) error {
	r, s, _, err := e.pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
	if err != nil {
		return err
	}
	info.Rank, info.Size = r, s
	return e.local(info, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
}

func (e env) slurm(info *EnvInfo) error {
	sizeKey := "SLURM_NTASKS"
	if !e.has(sizeKey) && e.has("SLURM_NPROCS") {
		sizeKey = "SLURM_NPROCS" // older Slurm
	}
	r, s, _, err := e.pair("SLURM_PROCID", sizeKey)
	if err != nil {
		return err
	}
	info.Rank, info.Size = r, s
	if !e.has("SLURM_LOCALID") {
		return e.errorf("SLURM_PROCID is set but SLURM_LOCALID is not (run the program with srun)")
	}
	if info.LocalRank, err = e.count("SLURM_LOCALID"); err != nil {
		return err
	}
	if info.LocalSize, err = e.slurmLocalSize(); err != nil {
		return err
	}
	if info.LocalRank >= info.LocalSize {
		return e.errorf("SLURM_LOCALID=%d is not less than the %d tasks on this node", info.LocalRank, info.LocalSize)
	}
	return nil
}

// slurmLocalSize prefers SLURM_NTASKS_PER_NODE (uniform by request) and falls
// back to this node's entry of SLURM_TASKS_PER_NODE, e.g. "8(x2),4" means two
// nodes with 8 tasks then one with 4; SLURM_NODEID picks the entry.
func (e env) slurmLocalSize() (int, error) {
	if e.has("SLURM_NTASKS_PER_NODE") {
		n, err := e.count("SLURM_NTASKS_PER_NODE")
		if err == nil && n == 0 {
			err = e.errorf("SLURM_NTASKS_PER_NODE=0; it must be at least 1")
		}
		return n, err
	}
	if !e.has("SLURM_TASKS_PER_NODE") {
		return 0, e.errorf("neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set, so the tasks per node are unknown")
	}
	v := e.str("SLURM_TASKS_PER_NODE")
	node := 0
	if e.has("SLURM_NODEID") {
		var err error
		if node, err = e.count("SLURM_NODEID"); err != nil {
			return 0, err
		}
	}
	n, err := tasksOnNode(v, node)
	if err != nil {
		return 0, e.errorf("SLURM_TASKS_PER_NODE=%q: %v", v, err)
	}
	return n, nil
}

// tasksOnNode expands Slurm's compressed list ("8(x2),4") at index node; an
// index past the end uses the first entry, as when SLURM_NODEID is unknown.
func tasksOnNode(v string, node int) (int, error) {
	first := -1
	for _, field := range strings.Split(v, ",") {
		count, reps := field, 1
		if i := strings.Index(field, "(x"); i >= 0 && strings.HasSuffix(field, ")") {
			var err error
			if reps, err = strconv.Atoi(field[i+2 : len(field)-1]); err != nil || reps < 1 {
				return 0, fmt.Errorf("bad repeat count in %q", field)
			}
			count = field[:i]
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("bad task count %q", field)
		}
		if first < 0 {
			first = n
		}
		if node < reps {
			return n, nil
		}
		node -= reps
	}
	if first < 0 {
		return 0, fmt.Errorf("empty list")
	}
	return first, nil
}

// master reads the rendezvous address, required only when there is someone
// to meet.
func (e env) master(info *EnvInfo) error {
	addrKey := "MASTER_ADDR"
	if e.has(EnvMasterAddr) {
		addrKey = EnvMasterAddr
	}
	info.MasterAddr = e.str(addrKey)
	if e.has("MASTER_PORT") {
		p, err := e.port("MASTER_PORT")
		if err != nil {
			return err
		}
		info.MasterPort = p
		info.RootPort = p
		if e.launcher == "torchrun" && strings.EqualFold(e.str("TORCHELASTIC_USE_AGENT_STORE"), "true") {
			// The torchrun agent serves its own store on MASTER_PORT.
			if p == 65535 {
				return e.errorf("MASTER_PORT=65535 is taken by torchrun's store and there is no next port; set %s", EnvMasterPort)
			}
			info.RootPort = p + 1
		}
	}
	if e.has(EnvMasterPort) {
		p, err := e.port(EnvMasterPort)
		if err != nil {
			return err
		}
		info.RootPort = p
	}
	if info.Size == 1 {
		return nil
	}
	var missing []string
	if info.MasterAddr == "" {
		missing = append(missing, "MASTER_ADDR")
	}
	if info.RootPort == 0 {
		missing = append(missing, "MASTER_PORT")
	}
	if len(missing) == 0 {
		return nil
	}
	hint := ""
	switch e.launcher {
	case "mpirun":
		hint = "; mpirun provides no rendezvous address, so export both (e.g. mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500)"
	case "slurm":
		hint = "; Slurm provides no rendezvous address, so export both (e.g. MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) MASTER_PORT=29500)"
	}
	return e.errorf("%s must be set when there are %d ranks%s", strings.Join(missing, " and "), info.Size, hint)
}

func (e env) launcherRunID() string {
	switch e.launcher {
	case "torchrun":
		if e.has("TORCHELASTIC_RUN_ID") {
			return "torchrun/" + e.str("TORCHELASTIC_RUN_ID") + "/" + e.str("TORCHELASTIC_RESTART_COUNT")
		}
	case "mpirun":
		if e.has("PMIX_NAMESPACE") {
			return "pmix/" + e.str("PMIX_NAMESPACE")
		}
	case "slurm":
		if e.has("SLURM_JOB_ID") {
			return "slurm/" + e.str("SLURM_JOB_ID") + "." + e.str("SLURM_STEP_ID")
		}
	}
	return ""
}

// ConnectFromEnv connects the TCP bootstrap described by info (see FromEnv).
// The unique id is info.UniqueID or, when the user set none, derived from the
// master address and the run id, which every rank can compute alone.
// A timeout of zero means the default (see Config.Timeout).
func ConnectFromEnv(ctx context.Context, info EnvInfo, timeout time.Duration) (Bootstrap, error) {
	cfg := Config{Rank: info.Rank, Size: info.Size, Timeout: timeout, UniqueID: info.UniqueID, ListenHost: info.ListenHost}
	if info.Size > 1 {
		if info.MasterAddr == "" || info.RootPort == 0 {
			return nil, fmt.Errorf("bootstrap: rank %d: no master address/port in EnvInfo for %d ranks", info.Rank, info.Size)
		}
		cfg.RootAddr = net.JoinHostPort(info.MasterAddr, strconv.Itoa(info.RootPort))
	}
	if cfg.UniqueID == "" {
		cfg.UniqueID = DeriveUniqueID(info.MasterAddr, info.MasterPort, info.RunID)
	}
	return Connect(ctx, cfg)
}
