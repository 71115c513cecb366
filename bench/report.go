package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// check is one line of a report: what was checked, what was found, and
// whether it passed. Skipped checks are neither failures nor passes.
type check struct {
	Section string `json:"section"`
	Name    string `json:"name"`
	Result  string `json:"result"`
	Status  string `json:"status"` // ok, fail, skip, info
}

type report struct {
	Checks []check `json:"checks"`
}

func (r *report) add(section, name, status, format string, a ...any) {
	r.Checks = append(r.Checks, check{section, name, fmt.Sprintf(format, a...), status})
}

func (r *report) ok(section, name, format string, a ...any) {
	r.add(section, name, "ok", format, a...)
}
func (r *report) info(section, name, format string, a ...any) {
	r.add(section, name, "info", format, a...)
}
func (r *report) skip(section, name, format string, a ...any) {
	r.add(section, name, "skip", format, a...)
}
func (r *report) fail(section, name, format string, a ...any) {
	r.add(section, name, "fail", format, a...)
}

func (r *report) failures() []string {
	var out []string
	for _, c := range r.Checks {
		if c.Status == "fail" {
			out = append(out, c.Section+"/"+c.Name+": "+c.Result)
		}
	}
	return out
}

// print writes the report as an aligned table grouped by section.
func (r *report) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	last := ""
	for _, c := range r.Checks {
		if c.Section != last {
			fmt.Fprintf(tw, "%s\n", strings.ToUpper(c.Section))
			last = c.Section
		}
		mark := map[string]string{"ok": "ok", "fail": "FAIL", "skip": "skip", "info": ""}[c.Status]
		lines := strings.Split(c.Result, "\n")
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", c.Name, mark, lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(tw, "  \t\t%s\n", l)
		}
	}
	tw.Flush()
}

func writeJSON(path string, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
