package plan

import (
	"fmt"
	"time"
)

// fifoSlots is the depth of a rank's trigger FIFO (upstream: 512).
const fifoSlots = 512

// trigger is one request a block pushes to its rank's proxy: a put (data
// or raw packets), a signal, or a sync (flush), or put+signal.
type trigger struct {
	ch     int // rank-level port channel
	put    bool
	raw    bool // copy packet words as they are
	signal bool
	sync   chan struct{}
	block  *Block
	src    Operand // local
	dst    Operand // remote (through a port channel)
}

// proxy is a rank's CPU proxy: it takes triggers in FIFO order, does the
// copies and signals, and answers syncs once everything before them is
// done. Data is read when the proxy gets to the trigger, not when it was
// pushed, as with a real DMA.
type proxy struct {
	l    *hostLaunch
	rank int
	fifo chan trigger
}

func newProxy(l *hostLaunch, rank int) *proxy {
	return &proxy{l: l, rank: rank, fifo: make(chan trigger, fifoSlots)}
}

func (p *proxy) serve() {
	for t := range p.fifo {
		if t.sync != nil {
			close(t.sync)
			continue
		}
		if err := p.handle(t); err != nil {
			p.l.fail(fmt.Errorf("plan %q: rank %d: proxy: port channel %d: %w", p.l.w.plan.Name, p.rank, t.ch, err))
		}
	}
}

func (p *proxy) handle(t trigger) error {
	l := p.l
	if t.put {
		if t.raw {
			src, err := l.packetRegion(p.rank, t.block, &t.src)
			if err != nil {
				return err
			}
			dst, err := l.packetRegion(p.rank, t.block, &t.dst)
			if err != nil {
				return err
			}
			copyPackets(dst, src)
		} else {
			data, err := l.read(p.rank, t.block, &t.src)
			if err != nil {
				return err
			}
			if err := l.write(p.rank, t.block, &t.dst, data); err != nil {
				return err
			}
		}
	}
	if t.signal {
		res := l.w.res[p.rank]
		peer, pair := res.PortChannels[t.ch].Peer, l.w.pairs[p.rank][1][t.ch]
		if pair >= 0 {
			l.chans[peer][1][pair].inbound.Add(1)
		}
	}
	return nil
}

// push queues a trigger, waiting (bounded) for a free slot.
func (p *proxy) push(t trigger) error {
	select {
	case p.fifo <- t:
		return nil
	default:
	}
	timer := time.NewTimer(p.l.w.cfg.Timeout)
	defer timer.Stop()
	select {
	case p.fifo <- t:
		return nil
	case <-p.l.ctx.Done():
		return errAborted
	case <-timer.C:
		return fmt.Errorf("port channel %d: %w after %s waiting for a free FIFO slot", t.ch, ErrTimeout, p.l.w.cfg.Timeout)
	}
}

// flush waits until the proxy has done every trigger pushed before it.
func (p *proxy) flush(ch int) error {
	done := make(chan struct{})
	if err := p.push(trigger{ch: ch, sync: done}); err != nil {
		return err
	}
	timer := time.NewTimer(p.l.w.cfg.Timeout)
	defer timer.Stop()
	select {
	case <-done:
		return nil
	case <-p.l.ctx.Done():
		return errAborted
	case <-timer.C:
		return fmt.Errorf("port channel %d: flush %w after %s", ch, ErrTimeout, p.l.w.cfg.Timeout)
	}
}

func (p *proxy) close() { close(p.fifo) }
