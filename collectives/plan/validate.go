package plan

import (
	"fmt"
)

// Validate checks everything the resolver and the interpreters rely on, so
// that no later stage can index out of range or wait for something that
// cannot exist. Errors name the plan, GPU, threadblock, op index and field.
// Parse and Load call it.
func (p *Plan) Validate() error {
	if p == nil {
		return ErrNil
	}
	if err := p.validateTop(); err != nil {
		return err
	}
	for g := range p.GPUs {
		if err := p.validateGPU(g); err != nil {
			return err
		}
	}
	return nil
}

func (p *Plan) validateTop() error {
	errf := func(field, format string, a ...any) error {
		return fmt.Errorf("%s: field %q: %s", p.label(), field, fmt.Sprintf(format, a...))
	}
	if p.Name == "" {
		return fmt.Errorf("plan: field \"name\": empty")
	}
	if p.Collective == "" {
		return errf("collective", "empty")
	}
	if p.Protocol != "Simple" && p.Protocol != "LL" {
		return errf("protocol", "%q (want Simple or LL)", clip(p.Protocol))
	}
	if p.BufferAlignment == 0 || p.BufferAlignment%8 != 0 || p.BufferAlignment > 1<<20 {
		return errf("buffer_alignment", "%d (want a multiple of 8, at most 1 MiB)", p.BufferAlignment)
	}
	if p.NumThreadsPerBlock < 1 || p.NumThreadsPerBlock > 1024 {
		return errf("num_threads_per_block", "%d (want 1..1024)", p.NumThreadsPerBlock)
	}
	if p.MinMessageSize > p.MaxMessageSize {
		return errf("min_message_size", "%d is above max_message_size %d", p.MinMessageSize, p.MaxMessageSize)
	}
	if len(p.GPUs) == 0 || len(p.GPUs) > MaxWorld {
		return errf("gpus", "%d entries (want 1..%d)", len(p.GPUs), MaxWorld)
	}
	g0 := p.GPUs[0]
	for g, gpu := range p.GPUs {
		if gpu.ID != g {
			return fmt.Errorf("%s: gpu %d: field \"id\": %d (gpus[i].id must be i)", p.label(), g, gpu.ID)
		}
		for _, c := range []struct {
			name string
			v    int
		}{{"input_chunks", gpu.InputChunks}, {"output_chunks", gpu.OutputChunks}, {"scratch_chunks", gpu.ScratchChunks}} {
			if c.v < 0 || c.v > maxChunks {
				return fmt.Errorf("%s: gpu %d: field %q: %d (want 0..%d)", p.label(), g, c.name, c.v, maxChunks)
			}
		}
		if gpu.InputChunks == 0 && gpu.OutputChunks == 0 {
			return fmt.Errorf("%s: gpu %d: input_chunks and output_chunks are both 0", p.label(), g)
		}
		// The chunk size is a property of the whole plan: every rank must
		// cut its buffers the same way for remote offsets to agree.
		if gpu.InputChunks != g0.InputChunks || gpu.OutputChunks != g0.OutputChunks {
			return fmt.Errorf("%s: gpu %d: input/output chunks %d/%d differ from gpu 0's %d/%d", p.label(), g,
				gpu.InputChunks, gpu.OutputChunks, g0.InputChunks, g0.OutputChunks)
		}
	}
	return nil
}

// gpuCtx carries what op validation needs about one GPU.
type gpuCtx struct {
	p        *Plan
	g        int
	gpu      *GPU
	nChan    [4]int // GPU-level channels per type (memory, port, switch)
	switchBT []BufKind
}

func (p *Plan) validateGPU(g int) error {
	gpu := &p.GPUs[g]
	W := len(p.GPUs)
	c := &gpuCtx{p: p, g: g, gpu: gpu}
	errf := func(format string, a ...any) error {
		return fmt.Errorf("%s: gpu %d: %s", p.label(), g, fmt.Sprintf(format, a...))
	}
	for i, ch := range gpu.Channels {
		ct, err := parseChannelType(ch.ChannelType)
		if err != nil || ct == ChanNone {
			return errf("channels[%d]: field \"channel_type\": %q (want memory, port or switch)", i, clip(ch.ChannelType))
		}
		if ct == ChanSwitch {
			bt, err := parseBufType(ch.BufferType)
			if err != nil {
				return errf("channels[%d]: field \"buffer_type\": %v", i, err)
			}
			if len(ch.RankGroups) == 0 {
				return errf("channels[%d]: field \"rank_groups\": empty", i)
			}
			for j, rg := range ch.RankGroups {
				if rg.Size < 0 || len(rg.Ranks) == 0 {
					return errf("channels[%d]: rank_groups[%d]: size %d with %d ranks", i, j, rg.Size, len(rg.Ranks))
				}
				for _, r := range rg.Ranks {
					if r < 0 || r >= W {
						return errf("channels[%d]: rank_groups[%d]: rank %d out of range (world %d)", i, j, r, W)
					}
				}
				c.nChan[ChanSwitch]++
				c.switchBT = append(c.switchBT, bt)
			}
			continue
		}
		for _, peer := range ch.ConnectedTo {
			if peer < 0 || peer >= W || peer == g {
				return errf("channels[%d]: field \"connected_to\": peer %d (want another rank of 0..%d)", i, peer, W-1)
			}
			c.nChan[ct]++
		}
	}
	for i, rb := range gpu.RemoteBuffers {
		if rb.Rank < 0 || rb.Rank >= W || rb.Rank == g {
			return errf("remote_buffers[%d]: field \"rank\": %d (want another rank of 0..%d)", i, rb.Rank, W-1)
		}
		if _, err := parseBufType(rb.Type); err != nil {
			return errf("remote_buffers[%d]: field \"type\": %v", i, err)
		}
		if len(rb.AccessChannelTypes) == 0 {
			return errf("remote_buffers[%d]: field \"access_channel_types\": empty", i)
		}
		for _, a := range rb.AccessChannelTypes {
			if ct, err := parseChannelType(a); err != nil || (ct != ChanMemory && ct != ChanPort) {
				return errf("remote_buffers[%d]: field \"access_channel_types\": %q (want memory or port)", i, clip(a))
			}
		}
	}
	if len(gpu.Semaphores) > MaxSemaphores {
		return errf("field \"semaphores\": %d (at most %d)", len(gpu.Semaphores), MaxSemaphores)
	}
	for i, s := range gpu.Semaphores {
		if s.InitValue < 0 || s.InitValue > 1<<30 {
			return errf("semaphores[%d]: field \"init_value\": %d", i, s.InitValue)
		}
	}
	if len(gpu.Threadblocks) == 0 || len(gpu.Threadblocks) > MaxThreadblocks {
		return errf("field \"threadblocks\": %d (want 1..%d)", len(gpu.Threadblocks), MaxThreadblocks)
	}
	for t := range gpu.Threadblocks {
		if err := c.validateTB(t); err != nil {
			return err
		}
	}
	return nil
}

func (c *gpuCtx) validateTB(t int) error {
	tb := &c.gpu.Threadblocks[t]
	errf := func(format string, a ...any) error {
		return fmt.Errorf("%s: gpu %d: threadblock %d: %s", c.p.label(), c.g, t, fmt.Sprintf(format, a...))
	}
	if tb.ID != t {
		return errf("field \"id\": %d (threadblocks[i].id must be i)", tb.ID)
	}
	var nTB [4]int
	for i, ch := range tb.Channels {
		ct, err := parseChannelType(ch.ChannelType)
		if err != nil || ct == ChanNone {
			return errf("channels[%d]: field \"channel_type\": %q", i, clip(ch.ChannelType))
		}
		for _, id := range ch.ChannelIDs {
			if id < 0 || id >= c.nChan[ct] {
				return errf("channels[%d]: field \"channel_ids\": %s channel %d out of range (gpu has %d)", i, ct, id, c.nChan[ct])
			}
			nTB[ct]++
		}
		if nTB[ct] > MaxChannelsPerBlock {
			return errf("more than %d %s channels", MaxChannelsPerBlock, ct)
		}
	}
	var nRB [4]int
	for i, rr := range tb.RemoteBufferRefs {
		ct, err := parseChannelType(rr.AccessChannelType)
		if err != nil || (ct != ChanMemory && ct != ChanPort) {
			return errf("remote_buffer_refs[%d]: field \"access_channel_type\": %q (want memory or port)", i, clip(rr.AccessChannelType))
		}
		for _, id := range rr.RemoteBufferIDs {
			if id < 0 || id >= len(c.gpu.RemoteBuffers) {
				return errf("remote_buffer_refs[%d]: field \"remote_buffer_ids\": %d out of range (gpu has %d remote buffers)", i, id, len(c.gpu.RemoteBuffers))
			}
			if !contains(c.gpu.RemoteBuffers[id].AccessChannelTypes, rr.AccessChannelType) {
				return errf("remote_buffer_refs[%d]: remote buffer %d is not accessible through %s channels", i, id, ct)
			}
			nRB[ct]++
		}
		if nRB[ct] > MaxChannelsPerBlock {
			return errf("more than %d remote buffers through %s channels", MaxChannelsPerBlock, ct)
		}
	}
	flat := 0
	for i := range tb.Ops {
		op := &tb.Ops[i]
		if err := c.validateOp(t, nTB, nRB, op, fmt.Sprintf("op %d", i), false); err != nil {
			return err
		}
		flat += 1 + len(op.Ops)
	}
	if flat > MaxOpsPerBlock {
		return errf("%d ops after pipelines are flattened (at most %d)", flat, MaxOpsPerBlock)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// refClass is what a buffer ref points at, for shape checks.
type refClass uint8

const (
	refLocal refClass = iota
	refRemote
	refSwitch
)

func (c *gpuCtx) validateOp(t int, nTB, nRB [4]int, op *Op, where string, inPipeline bool) error {
	name := clip(op.Name)
	errf := func(field, format string, a ...any) error {
		s := fmt.Sprintf("%s: gpu %d: threadblock %d: %s (%s)", c.p.label(), c.g, t, where, name)
		if field != "" {
			s += fmt.Sprintf(": field %q", field)
		}
		return fmt.Errorf("%s: %s", s, fmt.Sprintf(format, a...))
	}
	code, err := ParseOpcode(op.Name)
	if err != nil {
		return errf("name", "%v", err)
	}
	ct, err := parseChannelType(op.ChannelType)
	if err != nil {
		return errf("channel_type", "%v", err)
	}
	if op.ReduceOp != "" {
		if _, err := parseReduceOp(op.ReduceOp); err != nil {
			return errf("reduce_op", "%v", err)
		}
	}
	if len(op.ChannelIDs) > MaxChannelsPerOp {
		return errf("channel_ids", "%d channels (at most %d per op)", len(op.ChannelIDs), MaxChannelsPerOp)
	}
	for _, id := range op.ChannelIDs {
		if ct == ChanNone {
			return errf("channel_ids", "channel ids without a channel_type")
		}
		if id < 0 || id >= nTB[ct] {
			return errf("channel_ids", "%s channel %d out of range (threadblock has %d)", ct, id, nTB[ct])
		}
	}
	if len(op.Src) > MaxOperands || len(op.Dst) > MaxOperands {
		return errf("", "%d sources and %d destinations (at most %d each)", len(op.Src), len(op.Dst), MaxOperands)
	}
	src, err := c.classify(t, op.Src, ct, nRB, "src_buff", errf)
	if err != nil {
		return err
	}
	dst, err := c.classify(t, op.Dst, ct, nRB, "dst_buff", errf)
	if err != nil {
		return err
	}
	if op.TBGInfo != nil {
		g := op.TBGInfo
		if g.TBGSize < 1 || g.TBGSize > MaxThreadblocks || g.TBID < 0 || g.TBID >= g.TBGSize {
			return errf("tbg_info", "tb_id %d of tbg_size %d", g.TBID, g.TBGSize)
		}
	}
	if code != OpPipeline && (op.IterContext != nil || len(op.Ops) > 0) {
		return errf("ops", "only pipeline ops have a body")
	}
	shape := checkShape(code, ct, op, src, dst)
	if shape != "" {
		return errf("", "%s", shape)
	}
	// Every operand of an op covers the same number of chunks: the op
	// moves one size.
	refs := append(append([]BufRef(nil), op.Src...), op.Dst...)
	for i, r := range refs {
		if r.Size != refs[0].Size {
			return errf("", "operand %d covers %d chunks, operand 0 covers %d (an op moves one size)", i, r.Size, refs[0].Size)
		}
	}
	// Packet destinations in peers must be scratch: that is where packets
	// are read (with the flag) from.
	if code == OpPutPackets || code == OpReadPutPackets || code == OpReduceSendPackets || code == OpReduceCopySendPackets {
		for i, r := range op.Dst {
			if dst[i] == refRemote {
				if bt := c.remoteType(t, ct, *r.BufferID); bt != BufScratch {
					return errf("dst_buff", "dst %d: remote buffer is %s; packets go to a peer's scratch", i, bt)
				}
			}
		}
	}
	switch code {
	case OpBarrier:
		if op.BarrierID == nil || *op.BarrierID < 0 || *op.BarrierID >= MaxBarriers {
			return errf("barrier_id", "missing or out of range (want 0..%d)", MaxBarriers-1)
		}
		n := len(c.gpu.Threadblocks)
		if op.NumTBs == nil || *op.NumTBs < 1 || *op.NumTBs > n {
			return errf("num_threadblocks", "missing or out of range (want 1..%d)", n)
		}
	case OpSemAcquire, OpSemRelease:
		if len(op.SemaphoreIDs) == 0 || len(op.SemaphoreIDs) > MaxSemaphores {
			return errf("semaphore_ids", "%d ids (want 1..%d)", len(op.SemaphoreIDs), MaxSemaphores)
		}
		seen := map[int]bool{}
		for _, s := range op.SemaphoreIDs {
			if s < 0 || s >= len(c.gpu.Semaphores) {
				return errf("semaphore_ids", "semaphore %d out of range (gpu has %d)", s, len(c.gpu.Semaphores))
			}
			if seen[s] {
				return errf("semaphore_ids", "semaphore %d listed twice", s)
			}
			seen[s] = true
		}
	case OpPipeline:
		if inPipeline {
			return errf("ops", "pipelines do not nest")
		}
		if op.IterContext == nil {
			return errf("iter_context", "missing")
		}
		if op.IterContext.UnitSize == 0 || op.IterContext.UnitSize%8 != 0 || op.IterContext.UnitSize > 1<<40 || op.IterContext.NumChunks < 0 || op.IterContext.NumChunks > maxChunks {
			return errf("iter_context", "unit_size %d (want a positive multiple of 8), num_chunks %d", op.IterContext.UnitSize, op.IterContext.NumChunks)
		}
		if len(op.Ops) == 0 || len(op.Ops) > MaxPipelineBody {
			return errf("ops", "%d body ops (want 1..%d)", len(op.Ops), MaxPipelineBody)
		}
		for j := range op.Ops {
			if err := c.validateOp(t, nTB, nRB, &op.Ops[j], fmt.Sprintf("%s body op %d", where, j), true); err != nil {
				return err
			}
		}
	}
	return nil
}

// classify checks every ref of a list (ranges, ids) and says what each is.
func (c *gpuCtx) classify(t int, refs []BufRef, ct ChannelType, nRB [4]int, field string, errf func(string, string, ...any) error) ([]refClass, error) {
	out := make([]refClass, len(refs))
	for i, r := range refs {
		kinds := 0
		if r.Type != "" {
			kinds++
		}
		if r.BufferID != nil {
			kinds++
		}
		if r.SwitchChannelID != nil {
			kinds++
		}
		if kinds != 1 {
			return nil, errf(field, "ref %d: want exactly one of type, buffer_id and switch_channel_id", i)
		}
		if r.Index < 0 || r.Size < 0 || r.Index > maxChunks || r.Size > maxChunks {
			return nil, errf(field, "ref %d: index %d, size %d", i, r.Index, r.Size)
		}
		var chunks int
		switch {
		case r.Type != "":
			bt, err := parseBufType(r.Type)
			if err != nil {
				return nil, errf(field, "ref %d: %v", i, err)
			}
			out[i] = refLocal
			chunks = c.chunksOf(c.g, bt)
		case r.BufferID != nil:
			if ct != ChanMemory && ct != ChanPort {
				return nil, errf(field, "ref %d: a remote buffer needs channel_type memory or port (op has %q)", i, ct)
			}
			id := *r.BufferID
			if id < 0 || id >= nRB[ct] {
				return nil, errf(field, "ref %d: buffer_id %d out of range (threadblock has %d remote buffers through %s channels)", i, id, nRB[ct], ct)
			}
			out[i] = refRemote
			rb := c.gpu.RemoteBuffers[c.remoteGlobal(t, ct, id)]
			bt, _ := parseBufType(rb.Type)
			chunks = c.chunksOf(rb.Rank, bt)
		default:
			id := *r.SwitchChannelID
			if id < 0 || id >= c.nChan[ChanSwitch] {
				return nil, errf(field, "ref %d: switch_channel_id %d out of range (gpu has %d)", i, id, c.nChan[ChanSwitch])
			}
			out[i] = refSwitch
			chunks = -1
		}
		if chunks >= 0 && r.Index+r.Size > chunks {
			return nil, errf(field, "ref %d (%s): chunks [%d, %d) beyond the buffer's %d chunks", i, r.Type, r.Index, r.Index+r.Size, chunks)
		}
	}
	return out, nil
}

// chunksOf is the chunk count of buffer bt of rank g.
func (c *gpuCtx) chunksOf(g int, bt BufKind) int {
	gpu := &c.p.GPUs[g]
	switch bt {
	case BufInput:
		return gpu.InputChunks
	case BufOutput:
		return gpu.OutputChunks
	}
	return gpu.ScratchChunks
}

// remoteType is the type of a threadblock's remote buffer ref (validated).
func (c *gpuCtx) remoteType(t int, ct ChannelType, id int) BufKind {
	bt, _ := parseBufType(c.gpu.RemoteBuffers[c.remoteGlobal(t, ct, id)].Type)
	return bt
}

// remoteGlobal maps a threadblock's remote buffer ref (id-th of type ct)
// to the GPU's remote_buffers index (the ref is validated).
func (c *gpuCtx) remoteGlobal(t int, ct ChannelType, id int) int {
	return tbRemoteBuffers(&c.gpu.Threadblocks[t], ct)[id]
}

// tbRemoteBuffers lists a threadblock's remote buffers through channels of
// type ct, in order: buffer_id indexes it.
func tbRemoteBuffers(tb *Threadblock, ct ChannelType) []int {
	var out []int
	for _, rr := range tb.RemoteBufferRefs {
		if a, _ := parseChannelType(rr.AccessChannelType); a == ct {
			out = append(out, rr.RemoteBufferIDs...)
		}
	}
	return out
}

// tbChannels lists a threadblock's GPU channel indices of type ct, in
// order: channel_ids index it.
func tbChannels(tb *Threadblock, ct ChannelType) []int {
	var out []int
	for _, ch := range tb.Channels {
		if a, _ := parseChannelType(ch.ChannelType); a == ct {
			out = append(out, ch.ChannelIDs...)
		}
	}
	return out
}
