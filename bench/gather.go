package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/goep-dev/goep/channels/bootstrap"
)

// outcome is one rank's result of a multi-process benchmark: anything that
// travels as JSON and can carry a failure message.
type outcome interface {
	failure() string
	setFailure(msg string)
}

func (o chanOutcome) failure() string      { return o.Err }
func (o *chanOutcome) setFailure(m string) { o.Err = m }
func (o inOutcome) failure() string        { return o.Err }
func (o *inOutcome) setFailure(m string)   { o.Err = m }
func (o collOutcome) failure() string      { return o.Err }
func (o *collOutcome) setFailure(m string) { o.Err = m }

// gatherOutcomes brings every rank's outcome to rank 0, which gets them all
// (root true). Other ranks print a line when they succeeded and return their
// own failure as the error; rank 0 reports everyone's.
func gatherOutcomes[T any, P interface {
	*T
	outcome
}](ctx context.Context, bs bootstrap.Bootstrap, stdout io.Writer, mine T) (outs []T, root bool, err error) {
	own := P(&mine).failure()
	blob, _ := json.Marshal(mine)
	all, gerr := bs.AllGather(ctx, blob)
	if gerr != nil {
		if own != "" {
			return nil, false, errors.New(own)
		}
		return nil, false, fmt.Errorf("gathering results: %w", gerr)
	}
	if bs.Rank() != 0 {
		if own != "" {
			return nil, false, errors.New(own)
		}
		fmt.Fprintf(stdout, "rank %d: done\n", bs.Rank())
		return nil, false, nil
	}
	outs = make([]T, len(all))
	for i, b := range all {
		if err := json.Unmarshal(b, &outs[i]); err != nil {
			P(&outs[i]).setFailure(fmt.Sprintf("rank %d sent an unreadable result: %v", i, err))
		}
	}
	return outs, true, nil
}
