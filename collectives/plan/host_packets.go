package plan

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// LL packets on the host: a packet region is a run of 8-byte words
// {payload u32, flag u32} (little endian), which is upstream's LL8Packet and
// each half of its LL16Packet {data1, flag1, data2, flag2}. Words in scratch
// are read and written atomically: a reader spins on the flag, exactly as
// the GPU does, so it never takes a stale packet of an earlier launch.

// packetRegion is the bytes of a packet operand.
func (l *hostLaunch) packetRegion(rank int, b *Block, o *Operand) ([]byte, error) {
	_, buf := l.locate(rank, b, o)
	if err := span(buf, o.Offset, 2*o.Size, o); err != nil {
		return nil, err
	}
	return buf[o.Offset : o.Offset+2*o.Size], nil
}

func wordAt(region []byte, j int) (*atomic.Uint64, bool) {
	p := unsafe.Pointer(&region[8*j])
	if uintptr(p)%8 != 0 {
		return nil, false
	}
	return (*atomic.Uint64)(p), true
}

func storeWord(region []byte, j int, v uint64) {
	if w, ok := wordAt(region, j); ok {
		w.Store(v)
		return
	}
	binary.LittleEndian.PutUint64(region[8*j:], v) // unaligned: a local user buffer, never polled
}

func loadWord(region []byte, j int) uint64 {
	if w, ok := wordAt(region, j); ok {
		return w.Load()
	}
	return binary.LittleEndian.Uint64(region[8*j:])
}

// writePackets writes data (o.Size bytes, zero-padded) as packets of this
// launch's flag.
func (l *hostLaunch) writePackets(rank int, b *Block, o *Operand, data []byte) error {
	region, err := l.packetRegion(rank, b, o)
	if err != nil {
		return err
	}
	flag := uint64(l.flag) << 32
	var word [4]byte
	for j := 0; j < len(region)/8; j++ {
		word = [4]byte{}
		if 4*j < len(data) {
			copy(word[:], data[4*j:])
		}
		storeWord(region, j, uint64(binary.LittleEndian.Uint32(word[:]))|flag)
	}
	return nil
}

// readPackets waits for every packet of an operand to carry this launch's
// flag and returns the payload (o.Size bytes).
func (l *hostLaunch) readPackets(rank int, b *Block, o *Operand) ([]byte, error) {
	region, err := l.packetRegion(rank, b, o)
	if err != nil {
		return nil, err
	}
	out := make([]byte, o.Size)
	flag := uint64(l.flag)
	per := 2 // words a reader checks together: LL16 packets are two words
	if l.w.cfg.Packet == LL8 {
		per = 1
	}
	n := len(region) / 8
	for j := 0; j < n; j += per {
		for k := j; k < min(j+per, n); k++ {
			v := loadWord(region, k)
			if v>>32 != flag {
				err := l.wait(func() bool { v = loadWord(region, k); return v>>32 == flag }, func() string {
					return fmt.Sprintf("LL packet %d of %s at byte %d (flag %d, found %d)", k/per, o.Target, o.Offset+8*uint64(k), flag, loadWord(region, k)>>32)
				})
				if err != nil {
					return nil, err
				}
			}
			if 4*k < len(out) {
				var word [4]byte
				binary.LittleEndian.PutUint32(word[:], uint32(v))
				copy(out[4*k:], word[:])
			}
		}
	}
	return out, nil
}

// copyPackets copies packet words as they are (the port proxy's put of
// packet bytes), word by word.
func copyPackets(dst, src []byte) {
	for j := 0; j < min(len(dst), len(src))/8; j++ {
		storeWord(dst, j, loadWord(src, j))
	}
}
