package dl

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOpenSymClose(t *testing.T) {
	if !haveCgo {
		t.Skip("built without cgo")
	}
	lib, err := Open("libc.so.6")
	require.NoError(t, err)
	assert.Equal(t, "libc.so.6", lib.Requested())
	assert.True(t, filepath.IsAbs(lib.Path()), "the mapped file, not the soname: %q", lib.Path())
	p, err := lib.Sym("strlen")
	require.NoError(t, err)
	require.NotNil(t, p)
	_, err = lib.Sym("goep_no_such_symbol")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "goep_no_such_symbol")
	require.NoError(t, lib.Close())
	require.NoError(t, lib.Close(), "closing twice is a no-op")
	_, err = lib.Sym("strlen")
	assert.ErrorContains(t, err, "closed")

	var nilLib *Library
	_, err = nilLib.Sym("strlen")
	assert.Error(t, err)
	assert.NoError(t, nilLib.Close())
}

func TestOpenFailureSaysDlopen(t *testing.T) {
	if !haveCgo {
		t.Skip("built without cgo")
	}
	_, err := Open("/nonexistent/libgoep-none.so.1")
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "dlopen: /nonexistent/libgoep-none.so.1: "), err.Error())
	_, err = OpenLazy("/nonexistent/libgoep-none.so.1")
	assert.Error(t, err)
}

func touch(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, nil, 0o644))
	}
}

// rooted is an Env whose globs see only root (not the machine's real
// installations) and whose variables come from vars.
func rooted(root string, vars map[string]string) Env {
	return Env{
		Getenv: func(k string) string { return vars[k] },
		Glob: func(p string) ([]string, error) {
			if !strings.HasPrefix(p, root) {
				return nil, nil
			}
			return filepath.Glob(p)
		},
		Home: func() (string, error) {
			if vars["HOME"] == "" {
				return "", errors.New("no home")
			}
			return vars["HOME"], nil
		},
	}
}

func TestPlacesOrder(t *testing.T) {
	root := t.TempDir()
	cuda := filepath.Join(root, "cuda")
	venv := filepath.Join(root, "venv")
	home := filepath.Join(root, "home")
	touch(t,
		filepath.Join(cuda, "lib64", "libx.so.2"),
		filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "x", "lib", "libx.so.2"),
		filepath.Join(venv, "lib", "python3.11", "site-packages", "nvidia", "x", "lib", "libx.so.2"),
		filepath.Join(home, ".local", "lib", "python3.10", "dist-packages", "nvidia", "x", "lib", "libx.so.2"),
		filepath.Join(home, ".local", "lib", "python3.10", "dist-packages", "nvidia", "y", "lib", "libx.so.2"),
	)
	env := rooted(root, map[string]string{"CUDA_HOME": cuda, "VIRTUAL_ENV": venv, "HOME": home})
	s := Spec{File: "libx.so.2", Sonames: []string{"libx.so.2"}, SonamesFirst: true, WheelDirs: []string{"nvidia/x/lib"}}
	got := s.Candidates(env)
	want := []string{
		"libx.so.2",
		filepath.Join(cuda, "lib64", "libx.so.2"),
		filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "x", "lib", "libx.so.2"),
		filepath.Join(venv, "lib", "python3.11", "site-packages", "nvidia", "x", "lib", "libx.so.2"),
		filepath.Join(home, ".local", "lib", "python3.10", "dist-packages", "nvidia", "x", "lib", "libx.so.2"),
	}
	assert.Equal(t, want, got, "soname, CUDA_HOME, then the wheels (newer python first), only the named wheel dirs")

	s.SonamesFirst = false
	got = s.Candidates(env)
	assert.Equal(t, filepath.Join(cuda, "lib64", "libx.so.2"), got[0])
	assert.Equal(t, "libx.so.2", got[1], "sonames after the CUDA directories")
}

func TestSearch(t *testing.T) {
	root := t.TempDir()
	good := filepath.Join(root, "cuda", "lib64", "libx.so.2")
	touch(t, good)
	env := rooted(root, map[string]string{"CUDA_HOME": filepath.Join(root, "cuda")})
	s := Spec{EnvVar: "GOEP_X", File: "libx.so.2", Sonames: []string{"libx-missing.so.2"}, SonamesFirst: true, WheelDirs: []string{"nvidia/x/lib"}}
	var opened []string
	open := func(p string) (string, error) {
		opened = append(opened, p)
		if p == good {
			return p, nil
		}
		return "", errors.New("dlopen: " + p + ": cannot open shared object file")
	}
	v, err := Search(s, env, open)
	require.NoError(t, err)
	assert.Equal(t, good, v)
	assert.Equal(t, []string{"libx-missing.so.2", good}, opened)

	// Nothing usable: every place is named, with the reason.
	opened = nil
	_, err = Search(s, env, func(p string) (string, error) {
		opened = append(opened, p)
		return "", errors.New("not it")
	})
	var nf *NotFoundError
	require.True(t, errors.As(err, &nf), "%T %v", err, err)
	nf.What, nf.Fix = "x: cannot load libx", "install x"
	msg := nf.Error()
	assert.Contains(t, msg, "x: cannot load libx; looked at:")
	assert.Contains(t, msg, "libx-missing.so.2 (dynamic loader search path): not it")
	assert.Contains(t, msg, good+": not it")
	assert.Contains(t, msg, "$CUDA_PATH/lib64/libx.so.2: $CUDA_PATH is not set")
	assert.Contains(t, msg, "$VIRTUAL_ENV is not set")
	assert.Contains(t, msg, "no home directory")
	assert.Contains(t, msg, "/usr/local/cuda/lib64/libx.so.2: no match")
	assert.Contains(t, msg, "to fix: install x")
	assert.Equal(t, len(opened), 2)

	// The override is the only file tried.
	opened = nil
	env.Getenv = func(k string) string {
		if k == "GOEP_X" {
			return "/pinned/libx.so.2"
		}
		return ""
	}
	_, err = Search(s, env, open)
	var oe *OverrideError
	require.True(t, errors.As(err, &oe), "%T %v", err, err)
	assert.Equal(t, []string{"/pinned/libx.so.2"}, opened)
	assert.Contains(t, err.Error(), "GOEP_X=/pinned/libx.so.2 cannot be used: dlopen: /pinned/libx.so.2")
}

func TestSortLibraries(t *testing.T) {
	p := []string{"/a/libn.so.11.2", "/a/libn.so.12", "/a/libn.so", "/a/libn.so.12.4.127", "/b/libn.so.12"}
	SortLibraries(p)
	assert.Equal(t, []string{"/a/libn.so", "/a/libn.so.12.4.127", "/b/libn.so.12", "/a/libn.so.12", "/a/libn.so.11.2"}, p)
	assert.Equal(t, []int{12, 4, 127}, SoVersion("/x/libnvrtc.so.12.4.127"))
	assert.Nil(t, SoVersion("/x/libnvrtc.so"))
	assert.Equal(t, []int{11, 0}, SoVersion("libn.so.11.x"))
}
