package chaos_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sovereign-go/sovereign/internal/chaos"
)

// ReadLines ignores a torn last line (a process killed while writing it)
// but fails on a malformed line anywhere else: skipping it could drop an
// acquisition, and with it an overlap.
func TestReadLines(t *testing.T) {
	good := `{"ev":"start","id":"a"}` + "\n" + `{"ev":"acquire","term":1,"sent":10,"done":20}` + "\n"
	tests := []struct {
		name    string
		text    string
		want    int // lines read
		wantErr string
	}{
		{name: "whole", text: good, want: 2},
		{name: "torn last line", text: good + `{"ev":"renew","te`, want: 2},
		{name: "malformed line before the last", text: `{"ev":"start","id":"a"}` + "\n" + `{"ev":"acq` + "\n" + `{"ev":"lead","term":1}` + "\n", wantErr: "line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a.jsonl")
			if err := os.WriteFile(path, []byte(tt.text), 0o644); err != nil {
				t.Fatal(err)
			}
			lines, err := chaos.ReadLines(path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %d lines, error %v; want an error naming %q", len(lines), err, tt.wantErr)
				}
				return
			}
			if err != nil || len(lines) != tt.want {
				t.Fatalf("got %d lines, error %v; want %d, nil", len(lines), err, tt.want)
			}
			if lines[1].Ev != chaos.EvAcquire || lines[1].Term != 1 || lines[1].Done != 20 {
				t.Fatalf("got second line %+v, want the acquire of term 1 done at 20", lines[1])
			}
		})
	}
}

// A run saved with SaveRun, with each process's log beside it, loads back
// whole: analysing it again sees the same intervals and verdict.
func TestSaveLoadRun(t *testing.T) {
	dir := t.TempDir()
	run := handOver()
	run.Procs[0].KilledAt = msT(1500)
	run.Procs[0].Stops = [][2]int64{{msT(600), msT(700)}}
	run.Faults = []chaos.Fault{{Kind: "stop", Target: "a", At: msT(600), Healed: msT(700)}}
	if err := chaos.SaveRun(filepath.Join(dir, "run.json"), run); err != nil {
		t.Fatal(err)
	}
	if len(run.Procs[0].Lines) == 0 {
		t.Fatal("SaveRun cleared the caller's log lines")
	}
	for _, p := range run.Procs {
		f, err := os.Create(filepath.Join(dir, p.ID+".jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		lg := chaos.NewLogger(f)
		for _, l := range p.Lines {
			lg.Log(l)
		}
		if err := errors.Join(lg.Err(), f.Close()); err != nil {
			t.Fatal(err)
		}
	}
	got, err := chaos.LoadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, run) {
		t.Fatalf("LoadRun: got %+v, want %+v", got, run)
	}
	if r := chaos.Analyze(got); !r.OK() || r.Acquisitions != 2 {
		t.Fatalf("analysis of the loaded run: got %d acquisitions, violations %q; want 2, none", r.Acquisitions, r.Violations)
	}
}
