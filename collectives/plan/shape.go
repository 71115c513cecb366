package plan

import "fmt"

// checkShape checks an op's channel type, channels and operand lists
// against what its semantics need; "" when they fit. Operand kinds: src and
// dst say, per ref, whether it is local, remote or a switch channel.
func checkShape(code Opcode, ct ChannelType, op *Op, src, dst []refClass) string {
	nCh := len(op.ChannelIDs)
	all := func(cl []refClass, from int, want refClass) bool {
		for _, c := range cl[from:] {
			if c != want {
				return false
			}
		}
		return true
	}
	localScratch := func(refs []BufRef, from int) bool {
		for _, r := range refs[from:] {
			if r.Type != "s" {
				return false
			}
		}
		return true
	}
	noBuffers := func() string {
		if len(src) > 0 || len(dst) > 0 {
			return fmt.Sprintf("%s takes no buffers", code)
		}
		return ""
	}
	needChannels := func(types ...ChannelType) string {
		ok := false
		for _, t := range types {
			ok = ok || ct == t
		}
		if !ok {
			return fmt.Sprintf("channel_type %s (want %v)", ct, types)
		}
		if nCh == 0 {
			return "field \"channel_ids\": no channels"
		}
		return ""
	}
	switch code {
	case OpNop:
		return noBuffers()
	case OpBarrier, OpSemAcquire, OpSemRelease, OpPipeline:
		return noBuffers()
	case OpSignal, OpWait, OpRelaxedSignal, OpRelaxedWait:
		if s := noBuffers(); s != "" {
			return s
		}
		return needChannels(ChanMemory, ChanPort)
	case OpFlush:
		if s := noBuffers(); s != "" {
			return s
		}
		return needChannels(ChanPort)
	case OpPut, OpPutWithSignal, OpPutWithSignalAndFlush, OpPutPackets:
		if code != OpPut && code != OpPutPackets && ct != ChanPort {
			return fmt.Sprintf("%s needs channel_type port", code)
		}
		if ct != ChanMemory && ct != ChanPort {
			return fmt.Sprintf("channel_type %s (want memory or port)", ct)
		}
		if len(dst) == 0 || !all(dst, 0, refRemote) || len(src) == 0 || !all(src, 0, refLocal) {
			return "want local sources and remote destinations"
		}
		if len(src) != 1 && len(src) != len(dst) {
			return fmt.Sprintf("%d sources for %d destinations (want 1 or one each)", len(src), len(dst))
		}
		if ct == ChanPort && nCh != len(dst) {
			return fmt.Sprintf("port %s: %d channels for %d destinations (thread i uses channel i)", code, nCh, len(dst))
		}
		if code == OpPutPackets && ct == ChanPort && !localScratch(op.Src, 0) {
			return "port ppkt: sources must be packets in local scratch"
		}
	case OpGet:
		if ct != ChanMemory {
			return "get needs channel_type memory"
		}
		if len(src) == 0 || len(src) != len(dst) || !all(src, 0, refRemote) || !all(dst, 0, refLocal) {
			return "want remote sources and as many local destinations"
		}
	case OpCopy, OpCopyPackets, OpUnpackPackets:
		if len(src) != 1 || len(dst) != 1 || src[0] != refLocal || dst[0] != refLocal {
			return fmt.Sprintf("%s wants one local source and one local destination", code)
		}
		if code == OpUnpackPackets && !localScratch(op.Src, 0) {
			return "upkt reads packets from local scratch"
		}
	case OpReduce, OpReduceSend, OpReadReduce, OpReadReduceSend:
		remoteIn := code == OpReadReduce || code == OpReadReduceSend
		send := code == OpReduceSend || code == OpReadReduceSend
		if len(src) < 1 || src[0] != refLocal || len(dst) < 1 || dst[0] != refLocal {
			return "want a local first source and a local first destination"
		}
		if remoteIn && !all(src, 1, refRemote) || !remoteIn && !all(src, 1, refLocal) {
			return fmt.Sprintf("sources after the first must be %s", map[bool]string{true: "remote", false: "local"}[remoteIn])
		}
		if !send && len(dst) != 1 {
			return fmt.Sprintf("%s has one destination", code)
		}
		if send && !all(dst, 1, refRemote) {
			return "destinations after the first must be remote"
		}
		if (remoteIn && len(src) > 1 || send && len(dst) > 1) && ct != ChanMemory {
			return "remote operands of a reduction need channel_type memory"
		}
	case OpReadPutPackets:
		if ct != ChanMemory && ct != ChanPort {
			return fmt.Sprintf("channel_type %s (want memory or port)", ct)
		}
		if len(src) != 1 || src[0] != refLocal || !localScratch(op.Src, 0) {
			return "rppkt wants one source: packets in local scratch"
		}
		if len(dst) == 0 || !all(dst, 0, refRemote) {
			return "rppkt wants remote destinations"
		}
		if ct == ChanPort && nCh != len(dst) {
			return fmt.Sprintf("port rppkt: %d channels for %d destinations", nCh, len(dst))
		}
	case OpReducePackets, OpReduceSendPackets, OpReduceCopyPackets, OpReduceCopySendPackets:
		if len(src) < 1 || !all(src, 0, refLocal) || !localScratch(op.Src, 1) {
			return "want a local first source and packets in local scratch after it"
		}
		local := 1
		if code == OpReduceCopyPackets || code == OpReduceCopySendPackets {
			local = 2
		}
		if len(dst) < local || !all(dst[:local], 0, refLocal) {
			return fmt.Sprintf("want %d local first destinations", local)
		}
		send := code == OpReduceSendPackets || code == OpReduceCopySendPackets
		if !send && len(dst) != local {
			return fmt.Sprintf("%s has %d destinations", code, local)
		}
		if send && (!all(dst, local, refRemote) || len(dst) > local && ct != ChanMemory) {
			return "destinations after the local ones must be remote, through memory channels"
		}
	case OpMultiLoadReduceStore:
		if len(src) != 1 || len(dst) != 1 || src[0] != refSwitch || dst[0] != refSwitch {
			return "glres wants one switch source and one switch destination"
		}
	case OpMultiStore, OpMultiStorePackets:
		if len(src) != 1 || len(dst) != 1 || src[0] != refLocal || dst[0] != refSwitch {
			return fmt.Sprintf("%s wants one local source and one switch destination", code)
		}
	}
	return ""
}
