package bootstrap

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
)

// NewUniqueID returns a random 128-bit job id as 32 hex digits. Create it on
// one rank (or in the launcher) and give it to all ranks.
func NewUniqueID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails since Go 1.24 (it crashes the program instead)
	return hex.EncodeToString(b[:])
}

// DeriveUniqueID computes a job id every rank can work out by itself from what
// the launcher told all of them: the rendezvous address and, if the launcher
// provides one ($GOEP_RUN_ID), a per-run id. Without a run id, two jobs that
// reuse the same master address and port get the same id; that is tolerable
// because they could not both hold the root port at once.
func DeriveUniqueID(masterAddr string, masterPort int, runID string) string {
	h := sha256.New()
	h.Write([]byte("goep-bootstrap-id-v1\x00"))
	h.Write([]byte(masterAddr + ":" + strconv.Itoa(masterPort)))
	h.Write([]byte{0})
	h.Write([]byte(runID))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// validateUniqueID keeps ids usable inside socket names and log lines.
func validateUniqueID(id string) error {
	if id == "" {
		return fmt.Errorf("bootstrap: Config.UniqueID is empty; create one with NewUniqueID on one rank and share it, or use ConnectFromEnv")
	}
	if len(id) > 64 {
		return fmt.Errorf("bootstrap: unique id %.16q... is %d bytes, more than 64", id, len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c <= ' ' || c > '~' || c == '/' {
			return fmt.Errorf("bootstrap: unique id %q has character %q; use letters, digits and punctuation", id, c)
		}
	}
	return nil
}
