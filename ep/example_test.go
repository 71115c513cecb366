package ep_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/goep-dev/goep/channels/bootstrap"
	"github.com/goep-dev/goep/ep"
)

// Two ranks (goroutines on the host backend here; one process per GPU, or
// one goroutine per GPU, on a machine with GPUs) dispatch four tokens each
// to the ranks holding their experts (experts 0-1 on rank 0, 2-3 on rank
// 1), apply an "expert" to every received row (multiply it by the number
// of this rank's experts it names), and combine the results back: each
// token comes back multiplied by the number of experts it named.
func Example() {
	const ranks, tokens, hidden, topk, experts = 2, 4, 128, 2, 4
	boots, _ := bootstrap.NewInProcess(ranks, bootstrap.Config{})
	out := make([]string, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[r] = rank(boots[r], r, tokens, hidden, topk, experts)
		}()
	}
	wg.Wait()
	for _, s := range out {
		fmt.Print(s)
	}
	// Output:
	// rank 0: received 5 rows, tokens per local expert [4 3]
	// rank 0: token 0 = 2 (experts [0 3])
	// rank 0: token 1 = 1 (experts [1 -1])
	// rank 1: received 5 rows, tokens per local expert [3 4]
	// rank 1: token 0 = 2 (experts [2 3])
	// rank 1: token 1 = 2 (experts [0 2])
}

func rank(bs bootstrap.Bootstrap, r, tokens, hidden, topk, experts int) string {
	ctx := context.Background()
	dev, err := ep.OpenDevice(ep.Host, r) // ep.CUDA on GPUs
	if err != nil {
		return err.Error()
	}
	defer dev.Close()
	buf, err := ep.NewBuffer(ctx, bs, dev, ep.Config{MaxTokens: tokens, Hidden: hidden, TopK: topk, Experts: experts})
	if err != nil {
		return err.Error()
	}
	defer buf.Close(ctx)

	// This rank's tokens (every element of token t is t+1) and routing.
	routes := [][]int64{{0, 3, 1, -1, 0, 1, 3, 2}, {2, 3, 0, 2, 1, 0, 3, -1}}[r]
	x := make([]uint16, tokens*hidden)
	for i := range x {
		x[i] = bf16(float32(i/hidden + 1))
	}
	xPtr, idsPtr := upload(dev, x), upload(dev, routes)
	s := buf.Stream() // an engine passes its own: ep.WrapStream(dev, cuStream)

	res, err := buf.Dispatch(ctx, ep.DispatchArgs{
		X:      ep.NewTensor(xPtr, ep.BF16, tokens, hidden),
		TopK:   ep.NewTensor(idsPtr, ep.I64, tokens, topk),
		Stream: s,
	})
	if err != nil {
		return err.Error()
	}

	// "Expert compute": y = x * (number of this rank's experts the row
	// names). An engine runs its experts on s after res.Done instead.
	n := res.NumRecv
	rows := download[uint16](dev, res.RecvX.Ptr, n*hidden)
	local := download[int64](dev, res.RecvTopK.Ptr, n*topk)
	for i := 0; i < n; i++ {
		k := 0
		for _, e := range local[i*topk : (i+1)*topk] {
			if e >= 0 {
				k++
			}
		}
		for j := i * hidden; j < (i+1)*hidden; j++ {
			rows[j] = bf16(f32(rows[j]) * float32(k))
		}
	}
	// The experts write their outputs into the Buffer's combine input,
	// where the other ranks read them without a staging copy.
	y, _, err := buf.CombineInput(res.Handle)
	if err != nil {
		return err.Error()
	}
	raw, _ := binary.Append(nil, binary.LittleEndian, rows)
	if err := dev.CopyIn(y.Ptr, raw); err != nil {
		return err.Error()
	}

	comb, err := buf.Combine(ctx, ep.CombineArgs{X: y, Handle: res.Handle, Stream: s})
	if err != nil {
		return err.Error()
	}
	if err := comb.Done.SynchronizeContext(ctx); err != nil {
		return err.Error()
	}
	// Both Done events and the handle are this engine's until released.
	res.Done.Release()
	comb.Done.Release()
	res.Handle.Release()
	got := download[uint16](dev, comb.X.Ptr, tokens*hidden)
	text := fmt.Sprintf("rank %d: received %d rows, tokens per local expert %v\n", r, n, res.TokensPerExpert)
	for t := 0; t < 2; t++ {
		// Every element of token t was t+1.
		text += fmt.Sprintf("rank %d: token %d = %g (experts %v)\n", r, t, f32(got[t*hidden])/float32(t+1), routes[t*topk:(t+1)*topk])
	}
	return text
}

func upload[T any](dev ep.Device, v []T) uintptr {
	b, err := dev.Alloc(max(8*len(v), 256))
	if err != nil {
		panic(err)
	}
	raw, _ := binary.Append(nil, binary.LittleEndian, v)
	if err := dev.CopyIn(b.Ptr, raw); err != nil {
		panic(err)
	}
	return b.Ptr
}

func download[T any](dev ep.Device, p uintptr, n int) []T {
	raw := make([]byte, n*binary.Size(*new(T)))
	if err := dev.CopyOut(raw, p); err != nil {
		panic(err)
	}
	out := make([]T, n)
	_, _ = binary.Decode(raw, binary.LittleEndian, out)
	return out
}

func bf16(f float32) uint16 { return uint16(math.Float32bits(f) >> 16) }
func f32(b uint16) float32  { return math.Float32frombits(uint32(b) << 16) }
