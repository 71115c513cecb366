package core

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/goep-dev/goep/channels/bootstrap"
)

// IDSize is sizeof(ncclUniqueId).
const IDSize = 128

// A unique id carries goep's bootstrap rendezvous: a magic, the job's
// bootstrap id and the root's address ("host:port"), NUL-padded.
const (
	idMagic   = "goepNCCL1"
	idUIDAt   = 16 // 32 hex digits
	idAddrAt  = 48
	idAddrMax = IDSize - idAddrAt - 1
)

// Environment variables of the shim.
const (
	// EnvAddr is the host rank 0 listens on and puts in the unique id
	// (default: the address that reaches $MASTER_ADDR, else 127.0.0.1).
	EnvAddr = "GOEP_NCCL_ADDR"
	// EnvPlans names a directory of execution plans (MSCCL++ JSON) tried
	// first.
	EnvPlans = "GOEP_NCCL_PLANS"
	// EnvDebug = 1 prints each communicator's per-path call counts at
	// finalize, and every failed call.
	EnvDebug = "GOEP_NCCL_DEBUG"
	// EnvBackend = host runs ranks on goep's host backend (tests without a
	// GPU); cuda (the default) on the current GPU.
	EnvBackend = "GOEP_NCCL_BACKEND"
	// EnvEager = 1 creates the real NCCL communicator with goep's, instead
	// of at the first call that needs it (useful when that call would be
	// captured into a CUDA graph, where NCCL cannot set up).
	EnvEager = "GOEP_NCCL_EAGER"
)

// UniqueID is an ncclUniqueId made by goep.
type UniqueID [IDSize]byte

// NewUniqueID picks the root's address and a free port, and a job id. The
// port is free now; rank 0 binds it in Init.
func NewUniqueID() (UniqueID, error) {
	var id UniqueID
	host := strings.TrimSpace(os.Getenv(EnvAddr))
	if host == "" {
		host = localHost()
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return id, errorf(SystemError, "ncclGetUniqueId: no free port on %s (set %s to an address of this host): %v", host, EnvAddr, err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if len(addr) > idAddrMax {
		return id, errorf(InvalidArgument, "ncclGetUniqueId: address %q is longer than %d bytes", addr, idAddrMax)
	}
	copy(id[:], idMagic)
	copy(id[idUIDAt:], bootstrap.NewUniqueID())
	copy(id[idAddrAt:], addr)
	return id, nil
}

// localHost is the address peers reach this host at: the local end of a
// route to $MASTER_ADDR when the launcher set it, else loopback (one host).
func localHost() string {
	m := strings.TrimSpace(os.Getenv("MASTER_ADDR"))
	if m == "" || m == "localhost" || m == "127.0.0.1" || m == "::1" {
		return "127.0.0.1"
	}
	port := os.Getenv("MASTER_PORT")
	if _, err := strconv.Atoi(port); err != nil {
		port = "29500"
	}
	c, err := net.Dial("udp", net.JoinHostPort(m, port)) // no packet is sent
	if err != nil {
		return "127.0.0.1"
	}
	defer c.Close()
	if a, ok := c.LocalAddr().(*net.UDPAddr); ok {
		return a.IP.String()
	}
	return "127.0.0.1"
}

// parse reads the bootstrap id and root address out of id.
func (id UniqueID) parse() (uid, addr string, err error) {
	if !bytes.HasPrefix(id[:], []byte(idMagic)) {
		return "", "", errorf(InvalidArgument, "the unique id was not made by goep's ncclGetUniqueId (mixing the shim with another NCCL?)")
	}
	uid = string(bytes.TrimRight(id[idUIDAt:idAddrAt], "\x00"))
	addr = string(bytes.TrimRight(id[idAddrAt:], "\x00"))
	if len(uid) != 32 || addr == "" {
		return "", "", errorf(InvalidArgument, "corrupt unique id (job %q, address %q)", uid, addr)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", "", errorf(InvalidArgument, "corrupt unique id: address %q: %v", addr, err)
	}
	return uid, addr, nil
}

func (id UniqueID) String() string {
	uid, addr, err := id.parse()
	if err != nil {
		return "invalid unique id"
	}
	return fmt.Sprintf("job %s at %s", uid[:8], addr)
}
