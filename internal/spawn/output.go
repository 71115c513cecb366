package spawn

import (
	"bufio"
	"errors"
	"io"
	"os"
	"sync"
)

// maxLine bounds the memory one line may take; a longer "line" is emitted in
// pieces, each prefixed.
const maxLine = 1 << 20

// output serialises whole lines from all children onto the two writers, so
// lines never interleave mid-line.
type output struct {
	mu             sync.Mutex
	stdout, stderr io.Writer
}

func newOutput(stdout, stderr io.Writer) *output {
	return &output{stdout: stdout, stderr: stderr}
}

// copyLines reads r until EOF or until r is closed, writing each line to w
// with prefix.
func (o *output) copyLines(r *os.File, w io.Writer, prefix string) {
	o.copyLinesNoting(r, w, prefix, nil)
}

// copyLinesNoting is copyLines that also shows each line to note.
func (o *output) copyLinesNoting(r *os.File, w io.Writer, prefix string, note func(line []byte)) {
	br := bufio.NewReaderSize(r, maxLine)
	buf := make([]byte, 0, 256)
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			buf = append(buf[:0], prefix...)
			buf = append(buf, chunk...)
			if buf[len(buf)-1] != '\n' { // over-long line, or the last one without newline
				buf = append(buf, '\n')
			}
			o.mu.Lock()
			w.Write(buf) // a broken writer must not stop us draining the child
			o.mu.Unlock()
			if note != nil {
				note(chunk)
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}
