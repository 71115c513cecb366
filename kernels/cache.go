package kernels

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// cacheFormat is hashed into every key; bump it when the file layout or the
// meaning of the key changes, and old files are simply never looked up again.
const cacheFormat = "goep-kernels-cache/v1"

// A cache file is the CUBIN followed by a fixed trailer:
//
//	cubin            n bytes (an ELF image)
//	sha256(cubin)    32 bytes
//	key              32 bytes (the raw cache key)
//	n                8 bytes, little endian
//	trailerMagic     8 bytes
//
// A file that is short, lacks the magic, names another key, does not start
// with the ELF magic, or whose CUBIN does not hash to the recorded digest is
// rejected (and recompiled), so a truncated or corrupted file is never
// handed to the driver.
const (
	trailerMagic = "GOEPCB01"
	trailerSize  = 32 + 32 + 8 + len(trailerMagic)
)

var elfMagic = []byte("\x7fELF")

// errCorrupt marks a cache file that exists but fails validation.
var errCorrupt = errors.New("corrupt cache file")

func encodeCacheFile(cubin []byte, key [32]byte) []byte {
	out := make([]byte, 0, len(cubin)+trailerSize)
	out = append(out, cubin...)
	sum := sha256.Sum256(cubin)
	out = append(out, sum[:]...)
	out = append(out, key[:]...)
	out = binary.LittleEndian.AppendUint64(out, uint64(len(cubin)))
	out = append(out, trailerMagic...)
	return out
}

// decodeCacheFile validates a cache file's content and returns its CUBIN.
func decodeCacheFile(data []byte, key [32]byte) ([]byte, error) {
	if len(data) < trailerSize+len(elfMagic) {
		return nil, fmt.Errorf("%w: %d bytes is too short", errCorrupt, len(data))
	}
	t := data[len(data)-trailerSize:]
	if string(t[72:]) != trailerMagic {
		return nil, fmt.Errorf("%w: no trailer (truncated or not written by goep)", errCorrupt)
	}
	n := binary.LittleEndian.Uint64(t[64:72])
	if n != uint64(len(data)-trailerSize) {
		return nil, fmt.Errorf("%w: trailer records %d CUBIN bytes, file holds %d", errCorrupt, n, len(data)-trailerSize)
	}
	if !bytes.Equal(t[32:64], key[:]) {
		return nil, fmt.Errorf("%w: written for another cache key", errCorrupt)
	}
	cubin := data[:n:n]
	if !bytes.HasPrefix(cubin, elfMagic) {
		return nil, fmt.Errorf("%w: CUBIN is not an ELF image", errCorrupt)
	}
	if sum := sha256.Sum256(cubin); !bytes.Equal(sum[:], t[:32]) {
		return nil, fmt.Errorf("%w: CUBIN checksum mismatch", errCorrupt)
	}
	return cubin, nil
}

// readCacheFile returns the CUBIN stored at path: an error wrapping
// fs.ErrNotExist when there is none, errCorrupt when it is invalid.
func readCacheFile(path string, key [32]byte) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return decodeCacheFile(data, key)
}

// writeCacheFile stores cubin at path atomically: it writes a temporary file
// in the same directory, fsyncs it and renames it over path, so readers see
// either no file or the complete one.
func writeCacheFile(path string, cubin []byte, key [32]byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(encodeCacheFile(cubin, key)); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	// Persist the rename itself; failure here does not undo a visible,
	// complete file, so it is not an error.
	if d, derr := os.Open(dir); derr == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// probeWritable reports whether files can be created in dir.
func probeWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// errLockTimeout is returned by lockFile when another holder kept the lock
// past the timeout.
var errLockTimeout = errors.New("timed out waiting for the cache lock")

// lockFile takes an exclusive advisory lock on path (created if missing),
// polling until timeout. The lock dies with the process, so a crashed
// compiler never leaves a stale lock behind. Lock files are left in place:
// removing one could let two processes lock different inodes.
func lockFile(path string, timeout time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	wait := 2 * time.Millisecond
	for {
		locked, err := tryLock(f)
		if err != nil {
			f.Close()
			return nil, err
		}
		if locked {
			return func() {
				unlockFile(f)
				f.Close()
			}, nil
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, errLockTimeout
		}
		time.Sleep(wait)
		if wait < 20*time.Millisecond {
			wait *= 2
		}
	}
}

// cacheKey hashes everything that determines the CUBIN.
func cacheKey(m Module, source string, options []string, arch, nvrtcID string) [32]byte {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(cacheFormat)
	d := sourcesDigest()
	field(string(d[:]))
	field(m.Name)
	field(m.File)
	field(source) // the module's own text (also for inline sources)
	field(fmt.Sprint(len(options)))
	for _, o := range options {
		field(o)
	}
	field(arch)
	field(nvrtcID)
	var k [32]byte
	h.Sum(k[:0])
	return k
}

// sourcesDigest hashes the name and content of every embedded file: a change
// to any .cu or .cuh invalidates every module, which is simple and safe.
var sourcesDigest = sync.OnceValue(func() [32]byte {
	h := sha256.New()
	for _, name := range sourceNames() {
		s, _ := sourceFile(name)
		fmt.Fprintf(h, "%d:%s%d:", len(name), name, len(s))
		h.Write([]byte(s))
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
})

func keyString(k [32]byte) string { return hex.EncodeToString(k[:]) }
