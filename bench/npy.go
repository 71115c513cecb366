package bench

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/goep-dev/goep/routing"
	"io"
	"os"
	"strconv"
	"strings"
)

// NumPy .npy files (numpy.lib.format, versions 1.0, 2.0 and 3.0) holding a
// topk_idx: a 2-D, C-ordered, little-endian int64 ('<i8') or int32 ('<i4')
// array of shape (tokens, topk), as np.save(topk_idx.cpu().numpy()) writes.
//
// File layout: the magic "\x93NUMPY", major and minor version bytes, the
// header length (uint16 LE in 1.0; uint32 LE in 2.0 and 3.0), then the header:
// a Python dict literal with keys 'descr', 'fortran_order' and 'shape',
// padded with spaces and ended by '\n' so the data starts at a multiple of
// 64 bytes (16 in old files). 3.0 only differs by allowing UTF-8 in the
// header. The data follows, with nothing after it.

const npyMagic = "\x93NUMPY"

// maxNPYHeader bounds the header we accept; real ones are about 128 bytes.
const maxNPYHeader = 1 << 20

// NPYIndex is a topk_idx array read from a .npy file.
type NPYIndex struct {
	Tokens, K int
	Int32     bool    // the file held '<i4' (else '<i8')
	Idx       []int64 // row-major, Tokens*K
}

// Routing checks the array against experts and ranks and wraps it.
func (n *NPYIndex) Routing(experts, ranks int) (*routing.Routing, error) {
	if n == nil {
		return nil, errors.New("npy: nil index")
	}
	return routing.NewRouting(n.Idx, routing.Shape{Tokens: n.Tokens, K: n.K, Experts: experts, Ranks: ranks})
}

// LoadNPY reads a topk_idx .npy file.
func LoadNPY(path string) (*NPYIndex, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := ReadNPY(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// ReadNPY reads a topk_idx array in .npy format from r.
func ReadNPY(r io.Reader) (*NPYIndex, error) {
	var pre [8]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return nil, fmt.Errorf("npy: reading the magic: %w", eofAsTruncated(err))
	}
	if string(pre[:6]) != npyMagic {
		return nil, fmt.Errorf("npy: not a .npy file (magic %q, want %q)", pre[:6], npyMagic)
	}
	major, minor := pre[6], pre[7]
	var hlen int
	switch {
	case major == 1 && minor == 0:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf("npy: reading the header length: %w", eofAsTruncated(err))
		}
		hlen = int(binary.LittleEndian.Uint16(b[:]))
	case (major == 2 || major == 3) && minor == 0:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf("npy: reading the header length: %w", eofAsTruncated(err))
		}
		v := binary.LittleEndian.Uint32(b[:])
		if v > maxNPYHeader {
			return nil, fmt.Errorf("npy: header length %d is implausible (more than %d)", v, maxNPYHeader)
		}
		hlen = int(v)
	default:
		return nil, fmt.Errorf("npy: format version %d.%d not supported (want 1.0, 2.0 or 3.0)", major, minor)
	}
	hdr := make([]byte, hlen)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, fmt.Errorf("npy: reading the %d-byte header: %w", hlen, eofAsTruncated(err))
	}
	h, err := parseNPYHeader(string(hdr))
	if err != nil {
		return nil, fmt.Errorf("npy: header %s: %w", clip(strconv.Quote(strings.TrimRight(string(hdr), " \n")), npyEcho), err)
	}
	out := &NPYIndex{Tokens: h.shape[0], K: h.shape[1], Int32: h.elem == 4}
	want := int64(out.Tokens) * int64(out.K) * int64(h.elem)
	data, err := io.ReadAll(io.LimitReader(r, want+1))
	if err != nil {
		return nil, fmt.Errorf("npy: reading data: %w", err)
	}
	switch {
	case int64(len(data)) < want:
		return nil, fmt.Errorf("npy: data truncated: shape (%d, %d) of %s needs %d bytes, the file has %d",
			out.Tokens, out.K, h.descr, want, len(data))
	case int64(len(data)) > want:
		return nil, fmt.Errorf("npy: trailing bytes after the (%d, %d) %s array", out.Tokens, out.K, h.descr)
	}
	out.Idx = make([]int64, out.Tokens*out.K)
	for i := range out.Idx {
		if h.elem == 4 {
			out.Idx[i] = int64(int32(binary.LittleEndian.Uint32(data[4*i:])))
		} else {
			out.Idx[i] = int64(binary.LittleEndian.Uint64(data[8*i:]))
		}
	}
	return out, nil
}

func eofAsTruncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("file truncated")
	}
	return err
}

type npyHeader struct {
	descr string
	elem  int // bytes per element
	shape []int
}

// parseNPYHeader reads the header dict and checks it describes a C-ordered
// little-endian int32/int64 matrix.
func parseNPYHeader(s string) (npyHeader, error) {
	var h npyHeader
	if !strings.HasSuffix(s, "\n") {
		return h, errors.New("header does not end with a newline")
	}
	p := &dictParser{s: s}
	d, err := p.dict()
	if err != nil {
		return h, err
	}
	for k := range d {
		if k != "descr" && k != "fortran_order" && k != "shape" {
			return h, fmt.Errorf("unexpected key %q", clip(k, npyEcho))
		}
	}
	descr, ok := d["descr"].(string)
	if !ok {
		return h, errors.New("'descr' is missing or not a string")
	}
	switch descr {
	case "<i8":
		h.elem = 8
	case "<i4":
		h.elem = 4
	default:
		return h, fmt.Errorf("dtype %q not supported: topk_idx must be little-endian int64 '<i8' or int32 '<i4'", clip(descr, npyEcho))
	}
	h.descr = descr
	fortran, ok := d["fortran_order"].(bool)
	if !ok {
		return h, errors.New("'fortran_order' is missing or not True/False")
	}
	if fortran {
		return h, errors.New("fortran_order is True (column-major); save a C-ordered array (np.ascontiguousarray)")
	}
	shape, ok := d["shape"].([]int)
	if !ok {
		return h, errors.New("'shape' is missing or not a tuple of integers")
	}
	if len(shape) != 2 {
		return h, fmt.Errorf("shape %s has %d dimensions; topk_idx has 2: (tokens, topk)", tupleString(shape), len(shape))
	}
	if int64(shape[0])*int64(shape[1]) > 1<<40 {
		return h, fmt.Errorf("shape %s is implausibly large", tupleString(shape))
	}
	h.shape = shape
	return h, nil
}

func tupleString(v []int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.Itoa(x)
	}
	if len(v) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// dictParser reads the small Python literal subset .npy headers use: a dict
// of quoted-string keys to strings, True/False and tuples of non-negative
// integers.
type dictParser struct {
	s string
	i int
}

// npyEcho bounds how much of a header an error repeats: a corrupt header
// length can make the "header" megabytes of binary.
const npyEcho = 200

func (p *dictParser) ws() {
	for p.i < len(p.s) && strings.IndexByte(" \t\r\n", p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *dictParser) eat(c byte) bool {
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *dictParser) errorf(format string, a ...any) error {
	return fmt.Errorf("at byte %d: "+format, append([]any{p.i}, a...)...)
}

func (p *dictParser) dict() (map[string]any, error) {
	if !p.eat('{') {
		return nil, p.errorf("want '{'")
	}
	d := map[string]any{}
	for !p.eat('}') {
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		if _, dup := d[k]; dup {
			return nil, p.errorf("key %q repeated", k)
		}
		if !p.eat(':') {
			return nil, p.errorf("want ':' after %q", k)
		}
		if d[k], err = p.value(); err != nil {
			return nil, err
		}
		if !p.eat(',') {
			if !p.eat('}') {
				return nil, p.errorf("want ',' or '}'")
			}
			break
		}
	}
	p.ws()
	if p.i != len(p.s) {
		return nil, p.errorf("unexpected text after the dict")
	}
	return d, nil
}

func (p *dictParser) str() (string, error) {
	p.ws()
	if p.i >= len(p.s) || (p.s[p.i] != '\'' && p.s[p.i] != '"') {
		return "", p.errorf("want a quoted string")
	}
	q := p.s[p.i]
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return "", p.errorf("unterminated string")
	}
	v := p.s[p.i+1 : p.i+1+end]
	p.i += end + 2
	return v, nil
}

func (p *dictParser) value() (any, error) {
	p.ws()
	rest := p.s[p.i:]
	switch {
	case strings.HasPrefix(rest, "True"):
		p.i += 4
		return true, nil
	case strings.HasPrefix(rest, "False"):
		p.i += 5
		return false, nil
	case strings.HasPrefix(rest, "("):
		return p.tuple()
	case strings.HasPrefix(rest, "'"), strings.HasPrefix(rest, `"`):
		return p.str()
	}
	return nil, p.errorf("want a string, True, False or a tuple")
}

func (p *dictParser) tuple() ([]int, error) {
	p.eat('(')
	out := []int{}
	for !p.eat(')') {
		p.ws()
		j := p.i
		for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
			j++
		}
		if j-p.i > 12 {
			return nil, p.errorf("dimension %s is too large (more than 12 digits)", clip(p.s[p.i:j], 40))
		}
		n, err := strconv.Atoi(p.s[p.i:j])
		if err != nil {
			return nil, p.errorf("want a non-negative dimension")
		}
		p.i = j
		// Python 2 numpy on some platforms wrote longs: (4096L, 8L).
		if p.i < len(p.s) && p.s[p.i] == 'L' {
			p.i++
		}
		out = append(out, n)
		if !p.eat(',') {
			if !p.eat(')') {
				return nil, p.errorf("want ',' or ')' in the shape")
			}
			break
		}
	}
	return out, nil
}

// WriteNPY writes idx, a row-major (tokens, k) array, as a version 1.0 .npy
// file of '<i4' (asInt32) or '<i8', the way np.save does (header padded so
// the data starts at a multiple of 64 bytes).
func WriteNPY(w io.Writer, idx []int64, tokens, k int, asInt32 bool) error {
	if tokens < 0 || k < 0 || len(idx) != tokens*k {
		return fmt.Errorf("npy: %d values do not make a (%d, %d) array", len(idx), tokens, k)
	}
	descr, elem := "<i8", 8
	if asInt32 {
		descr, elem = "<i4", 4
	}
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%d, %d), }", descr, tokens, k)
	pad := 64 - (len(npyMagic)+2+2+len(dict)+1)%64
	if pad == 64 {
		pad = 0
	}
	hdr := dict + strings.Repeat(" ", pad) + "\n"
	if len(hdr) > 0xffff {
		return errors.New("npy: header too long for format 1.0")
	}
	b := make([]byte, 0, len(hdr)+10+elem*len(idx))
	b = append(b, npyMagic...)
	b = append(b, 1, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(hdr)))
	b = append(b, hdr...)
	for i, v := range idx {
		if elem == 8 {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
			continue
		}
		if v != int64(int32(v)) {
			return fmt.Errorf("npy: value %d at [%d][%d] does not fit int32", v, i/k, i%k)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(int32(v)))
	}
	_, err := w.Write(b)
	return err
}
