package nccl

import (
	"context"
	"fmt"
	"strings"

	"github.com/goep-dev/goep/channels/bootstrap"
)

// InitOverBootstrap creates an NCCL communicator of bs's ranks (collective:
// every rank calls it). Every rank loads NCCL and says whether it could;
// rank 0's unique id reaches the others through bs; every rank joins. A
// failure anywhere fails every rank, naming the ranks and their reasons, so
// the ranks agree on whether NCCL is usable. ctx binds as in InitRank.
func InitOverBootstrap(ctx context.Context, bs bootstrap.Bootstrap, cuCtx uintptr) (*Library, *Comm, error) {
	lib, err := Load()
	msg := []byte{0}
	if err != nil {
		msg = append([]byte{1}, err.Error()...)
	} else if bs.Rank() == 0 {
		id, err := GetUniqueID()
		if err != nil {
			msg = append([]byte{1}, err.Error()...)
		} else {
			msg = append(msg, id[:]...)
		}
	}
	all, err := bs.AllGather(ctx, msg)
	if err != nil {
		return nil, nil, fmt.Errorf("NCCL setup: %w", err)
	}
	var bad []string
	for r, m := range all {
		if len(m) == 0 || m[0] != 0 {
			bad = append(bad, fmt.Sprintf("rank %d: %s", r, strings.TrimSpace(string(m[min(1, len(m)):]))))
		}
	}
	if len(bad) > 0 {
		return nil, nil, fmt.Errorf("NCCL unavailable: %s", strings.Join(bad, "; "))
	}
	if len(all[0]) != 1+UniqueIDSize {
		return nil, nil, fmt.Errorf("NCCL setup: rank 0 sent a %d-byte unique id", len(all[0])-1)
	}
	var id UniqueID
	copy(id[:], all[0][1:])
	comm, err := InitRank(cuCtx, bs.Size(), id, bs.Rank())
	if err != nil {
		return nil, nil, err
	}
	return lib, comm, nil
}
