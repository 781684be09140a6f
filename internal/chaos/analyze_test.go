package chaos_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/internal/chaos"
)

// Synthetic histories for Analyze, in milliseconds on a made-up clock, with
// the options of the real runs: TTL 2 s, renew deadline 1.4 s, heartbeat TTL
// 7 s.

func msT(v int64) int64 { return v * int64(time.Millisecond) }

func startLine(id string) chaos.Line {
	return chaos.Line{Ev: chaos.EvStart, ID: id, T: 1,
		OptTTL: int64(2 * time.Second), OptRenewDeadline: int64(1400 * time.Millisecond),
		OptRenewInterval: int64(400 * time.Millisecond), OptHeartbeatTTL: int64(7 * time.Second)}
}

func hb(sent, done int64) chaos.Line {
	return chaos.Line{Ev: chaos.EvHeartbeat, Sent: msT(sent), Done: msT(done)}
}

func acquire(term uint64, sent, done int64) chaos.Line {
	return chaos.Line{Ev: chaos.EvAcquire, Term: term, TTL: int64(2 * time.Second), Sent: msT(sent), Done: msT(done)}
}

func renew(term uint64, sent, done int64) chaos.Line {
	return chaos.Line{Ev: chaos.EvRenew, Term: term, Sent: msT(sent), Done: msT(done)}
}

func lead(term uint64, t int64) chaos.Line {
	return chaos.Line{Ev: chaos.EvLead, Term: term, T: msT(t)}
}

func write(term, seq uint64, pre int64) chaos.Line {
	return chaos.Line{Ev: chaos.EvWrite, Term: term, Seq: seq, Pre: msT(pre), Post: msT(pre) + 1,
		Sent: msT(pre + 15), Done: msT(pre + 16), Status: chaos.StatusAccepted}
}

func lost(term uint64, t int64, reason string) chaos.Line {
	return chaos.Line{Ev: chaos.EvLost, Term: term, T: msT(t), Reason: reason}
}

func release(term uint64, sent int64) chaos.Line {
	return chaos.Line{Ev: chaos.EvRelease, Term: term, Sent: msT(sent), Done: msT(sent + 1)}
}

func storeWrite(id string, term, seq uint64, at int64, accepted bool) chaos.Write {
	return chaos.Write{ID: id, Term: term, Seq: seq, At: msT(at), Accepted: accepted}
}

// handOver is a clean history: a resigns at 1000, b takes over at 1020.
func handOver() chaos.Run {
	return chaos.Run{
		Procs: []chaos.Proc{
			{ID: "a", Lines: []chaos.Line{
				startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25), write(1, 1, 30),
				renew(1, 400, 410), write(1, 2, 500), lost(1, 1000, "resigned"), release(1, 1002),
			}},
			{ID: "b", Lines: []chaos.Line{
				startLine("b"), hb(0, 5), acquire(2, 1010, 1020), lead(2, 1025), write(2, 1, 1030),
			}},
		},
		Writes: []chaos.Write{
			storeWrite("a", 1, 1, 50, true), storeWrite("a", 1, 2, 520, true), storeWrite("b", 2, 1, 1050, true),
		},
		End:   msT(2000),
		Bound: 4100 * time.Millisecond,
	}
}

// dataLoss is a clean history across a restart that lost the store's data:
// a leads term 1; the store goes down at 900, is started again at 990 and
// seen answering, empty, at 1000; b acquires the empty key at 1050 (term 2) while a still believes it
// leads; a's renewal sent at 1200 finds its lease gone and a steps down at
// 1210. The overlap [1050, 1210) lies inside the data-loss window, which
// ends at 1000 + 1050.
func dataLoss() chaos.Run {
	return chaos.Run{
		Procs: []chaos.Proc{
			{ID: "a", Lines: []chaos.Line{
				startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25), write(1, 1, 30),
				renew(1, 400, 410), renew(1, 800, 810), write(1, 2, 1080), lost(1, 1210, "lease lost"),
			}},
			{ID: "b", Lines: []chaos.Line{
				startLine("b"), hb(0, 5), acquire(2, 1040, 1050), lead(2, 1055), write(2, 1, 1060),
			}},
		},
		Faults: []chaos.Fault{{Kind: "redis-restart-nopersist", At: msT(900), Restarted: msT(990), Healed: msT(1000), Server: true, DataLoss: true}},
		Writes: []chaos.Write{
			storeWrite("a", 1, 1, 50, true), storeWrite("b", 2, 1, 1075, true), storeWrite("a", 1, 2, 1100, false),
		},
		End:            msT(3000),
		Bound:          4100 * time.Millisecond,
		DataLossWindow: 1050 * time.Millisecond,
		ServerBound:    3 * time.Second,
	}
}

// TestAnalyzeDataLoss proves that each check around data loss and same-ID
// processes fails on a history that breaks it.
func TestAnalyzeDataLoss(t *testing.T) {
	tests := []struct {
		name   string
		modify func(r *chaos.Run)
		want   string // substring of a violation; "" means none
	}{
		{name: "overlap inside the data-loss window", modify: func(*chaos.Run) {}},
		{
			name: "a follower acquires before the store is seen answering",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2] = acquire(2, 992, 995) // restarted at 990, seen at 1000
			},
		},
		{
			name: "a follower acquires before the restart",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2] = acquire(2, 980, 985)
			},
			want: "overlap: b term 2",
		},
		{
			name:   "the same overlap without data loss",
			modify: func(r *chaos.Run) { r.Faults[0].DataLoss = false },
			want:   "overlap: b term 2",
		},
		{
			name: "the old leader believes past the window",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[8] = lost(1, 2100, "lease lost") // window ends at 2050
			},
			want: "overlap outlasting the data-loss window",
		},
		{
			name: "a follower acquires after the window, the old leader still leading",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = append(r.Procs[0].Lines[:8], renew(1, 1200, 1210), renew(1, 1600, 1610), renew(1, 2000, 2010), lost(1, 2200, "lease lost"))
				r.Procs[1].Lines[2] = acquire(2, 2090, 2100) // window ends at 2050
				r.Writes = r.Writes[:1]
			},
			want: "overlap: b term 2",
		},
		{
			name: "cascade: a second leadership after one restart",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines = append(r.Procs[1].Lines, lost(2, 1400, "resigned"), release(2, 1401))
				r.Procs = append(r.Procs, chaos.Proc{ID: "c", Lines: []chaos.Line{
					startLine("c"), hb(0, 5), acquire(3, 1500, 1510), lead(3, 1515),
				}})
			},
			want: "cascade",
		},
		{
			name: "lock mode: holds handed over after one restart are no cascade",
			modify: func(r *chaos.Run) {
				r.Handover = true
				r.Procs[1].Lines = append(r.Procs[1].Lines, lost(2, 1400, "resigned"), release(2, 1401))
				r.Procs = append(r.Procs, chaos.Proc{ID: "c", Lines: []chaos.Line{
					startLine("c"), hb(0, 5), acquire(3, 1500, 1510), lead(3, 1515),
				}})
			},
		},
		{
			name: "lock mode: an overlap is still one",
			modify: func(r *chaos.Run) {
				r.Handover = true
				r.Procs[1].Lines[2] = acquire(2, 980, 985)
			},
			want: "overlap: b term 2",
		},
		{
			name: "term below an earlier one after data loss",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[2], r.Procs[0].Lines[3], r.Procs[0].Lines[4] = acquire(5, 10, 20), lead(5, 25), write(5, 1, 30)
				r.Procs[0].Lines[5], r.Procs[0].Lines[6], r.Procs[0].Lines[7] = renew(5, 400, 410), renew(5, 800, 810), write(5, 2, 1080)
				r.Procs[0].Lines[8] = lost(5, 1210, "lease lost")
				r.Writes = []chaos.Write{storeWrite("a", 5, 1, 50, true)}
			},
			want: "term after data loss",
		},
		{
			name: "a term equal to an earlier one after data loss",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2], r.Procs[1].Lines[3], r.Procs[1].Lines[4] = acquire(1, 1040, 1050), lead(1, 1055), write(1, 3, 1060)
				r.Writes[1] = storeWrite("b", 1, 3, 1075, true)
			},
			want: "term after data loss",
		},
		{
			name: "stale write accepted inside the window",
			modify: func(r *chaos.Run) {
				r.Writes[2].Accepted = true
			},
			want: "stale write accepted",
		},
		{
			name: "no leader within TTL + 1 s of the store coming back",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2] = acquire(2, 4040, 4050)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 4055), write(2, 1, 4060)
				r.Writes = r.Writes[:1]
				r.End = msT(5000)
			},
			want: "slow leader after redis-restart-nopersist",
		},
		{
			name: "same-ID process takes the live lease",
			modify: func(r *chaos.Run) {
				r.Faults = []chaos.Fault{{Kind: chaos.KindSameID, Target: "a", At: msT(500), Healed: msT(1300)}}
				r.Procs[0].Lines = r.Procs[0].Lines[:6]
				r.Procs[0].Lines = append(r.Procs[0].Lines, lost(1, 700, "lease lost"))
				r.Writes = r.Writes[:2]
			},
			want: "same-id: a lost its live lease",
		},
		{
			name: "same-ID fault with the leader losing by its deadline",
			modify: func(r *chaos.Run) {
				r.Faults = []chaos.Fault{{Kind: chaos.KindSameID, Target: "a", At: msT(500), Healed: msT(1300)}}
				r.Procs[0].Lines = r.Procs[0].Lines[:6]
				r.Procs[0].Lines = append(r.Procs[0].Lines, lost(1, 700, "renew deadline passed"))
				r.Writes = r.Writes[:2]
			},
		},
		{
			// c begins after the next fault (at 1300): only b began between
			// the restart and it, so there is no cascade.
			name: "a leadership after the next fault is no cascade",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines = append(r.Procs[1].Lines, lost(2, 1400, "resigned"), release(2, 1401))
				r.Procs = append(r.Procs, chaos.Proc{ID: "c", Lines: []chaos.Line{
					startLine("c"), hb(0, 5), acquire(3, 1590, 1600), lead(3, 1605),
				}})
				r.Faults = append(r.Faults, chaos.Fault{Kind: "latency", Target: "b", At: msT(1300), Healed: msT(1350)})
			},
		},
		{
			// Nobody acquires the empty store: a's lease is gone, so a does
			// not count as a leader after it.
			name: "no leader after the store came back empty",
			modify: func(r *chaos.Run) {
				r.Procs = r.Procs[:1]
				r.Writes = r.Writes[:1]
			},
			want: "no leader after redis-restart-nopersist: the store came back at 1000.0ms",
		},
		{
			// A persistent restart: a stepped down at 950, during the outage,
			// so it is no leader when the store is back; b acquires 4 s
			// after.
			name: "a leader that stepped down during the outage",
			modify: func(r *chaos.Run) {
				r.Faults[0].Kind, r.Faults[0].DataLoss = "redis-restart", false
				r.Procs[0].Lines = append(r.Procs[0].Lines[:7], lost(1, 950, "renew deadline passed"))
				r.Procs[1].Lines[2] = acquire(2, 4990, 5000)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 5005), write(2, 1, 5010)
				r.Writes = r.Writes[:1]
				r.End = msT(6000)
			},
			want: "slow leader after redis-restart: the store came back at 1000.0ms, b term 2 acquired 4s later",
		},
		{
			// The same-ID fault was aimed at b: a losing its lease meanwhile
			// is not the fault's doing.
			name: "same-ID fault aimed at another process",
			modify: func(r *chaos.Run) {
				r.Faults = []chaos.Fault{{Kind: chaos.KindSameID, Target: "b", At: msT(500), Healed: msT(1300)}}
				r.Procs[0].Lines = r.Procs[0].Lines[:6]
				r.Procs[0].Lines = append(r.Procs[0].Lines, lost(1, 700, "lease lost"))
				r.Procs[1].Lines[2] = acquire(2, 790, 800)
				r.Writes = r.Writes[:1]
			},
		},
		{
			// The window ends at 1000 + 1050 = 2050: a belief that ends
			// there is inside it, one a nanosecond later outlasts it.
			name: "the old leader's belief ends exactly at the window's end",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[8] = lost(1, 2050, "lease lost")
			},
		},
		{
			name: "the old leader's belief ends just past the window's end",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[8].T = msT(2050) + 1
			},
			want: "overlap outlasting the data-loss window: b term 2",
		},
		{
			// b acquired between the restart and the store seen answering,
			// so from the store that came back: c overlapping b is not
			// explained by data loss (both began after the restart).
			name: "an overlap of two leaderships begun after the restart",
			modify: func(r *chaos.Run) {
				r.Handover = true
				r.Procs[1].Lines = []chaos.Line{
					startLine("b"), hb(0, 5), acquire(2, 992, 995), lead(2, 1000), lost(2, 1200, "resigned"), release(2, 1201),
				}
				r.Procs = append(r.Procs, chaos.Proc{ID: "c", Lines: []chaos.Line{
					startLine("c"), hb(0, 5), acquire(3, 1090, 1100), lead(3, 1105),
				}})
				r.Writes = r.Writes[:1]
			},
			want: "overlap: c term 3 started at 1100.0ms, 100.0ms before b term 2 ended",
		},
		{
			// An Acquire that returned at the restart itself was answered by
			// the store that came back.
			name: "an overlap with a leadership begun at the restart",
			modify: func(r *chaos.Run) {
				r.Handover = true
				r.Procs[1].Lines = []chaos.Line{
					startLine("b"), hb(0, 5), acquire(2, 985, 990), lead(2, 1000), lost(2, 1200, "resigned"), release(2, 1201),
				}
				r.Procs = append(r.Procs, chaos.Proc{ID: "c", Lines: []chaos.Line{
					startLine("c"), hb(0, 5), acquire(3, 1090, 1100), lead(3, 1105),
				}})
				r.Writes = r.Writes[:1]
			},
			want: "overlap: c term 3 started at 1100.0ms, 100.0ms before b term 2 ended",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := dataLoss()
			tt.modify(&run)
			r := chaos.Analyze(run)
			if tt.want == "" {
				if !r.OK() {
					t.Fatalf("got violations %q, want none", r.Violations)
				}
				return
			}
			for _, v := range r.Violations {
				if strings.Contains(v, tt.want) {
					return
				}
			}
			t.Fatalf("got violations %q, want one containing %q", r.Violations, tt.want)
		})
	}
}

// TestAnalyzeDataLossCounts checks the data-loss figures of the summary.
func TestAnalyzeDataLossCounts(t *testing.T) {
	r := chaos.Analyze(dataLoss())
	if !r.OK() {
		t.Fatalf("got violations %q, want none", r.Violations)
	}
	if r.Overlaps != 0 || r.DataLossFaults != 1 || r.DataLossOverlaps != 1 || r.DataLossOverlapMax != 160*time.Millisecond {
		t.Fatalf("got overlaps %d, data-loss faults %d, data-loss overlaps %d (max %v); want 0, 1, 1 (max 160ms)",
			r.Overlaps, r.DataLossFaults, r.DataLossOverlaps, r.DataLossOverlapMax)
	}
	if r.DataLossHeld != 1 || r.DataLossStepDownMax != 210*time.Millisecond {
		t.Fatalf("got %d leaders still leading when the store came back, step-down max %v; want 1, 210ms (1000 to 1210)",
			r.DataLossHeld, r.DataLossStepDownMax)
	}
	if r.StaleRejectedDataLoss != 1 || r.TermsAcrossDataLoss != 1 {
		t.Fatalf("got stale writes rejected in the window %d, terms checked across data loss %d; want 1, 1",
			r.StaleRejectedDataLoss, r.TermsAcrossDataLoss)
	}
	if r.ServerFaults != 1 || r.ServerGapMax != 50*time.Millisecond || r.NewLeadersMax != 1 {
		t.Fatalf("got server faults %d, gap to a leader %v, new leaderships %d; want 1, 50ms, 1",
			r.ServerFaults, r.ServerGapMax, r.NewLeadersMax)
	}
	if s := r.String(); !strings.Contains(s, "overlaps inside data-loss windows: 1, max length 160ms") {
		t.Fatalf("summary lacks the data-loss window's figures:\n%s", s)
	}
	// An overlap lasts until the first of the two ends: b resigning at 1100,
	// before a steps down at 1210, makes it 50 ms long.
	run := dataLoss()
	run.Procs[1].Lines = append(run.Procs[1].Lines, lost(2, 1100, "resigned"), release(2, 1101))
	r = chaos.Analyze(run)
	if !r.OK() || r.DataLossOverlaps != 1 || r.DataLossOverlapMax != 50*time.Millisecond {
		t.Fatalf("b resigning first: got data-loss overlaps %d (max %v), violations %q; want 1 (max 50ms), none",
			r.DataLossOverlaps, r.DataLossOverlapMax, r.Violations)
	}
}

// heartbeatsFail is the log of a, which leads term 1 from 20 and renews
// every 400 ms until lastRenew, while its heartbeats, successful at 0, fail
// from 5000 on.
func heartbeatsFail(lastRenew int64) []chaos.Line {
	lines := []chaos.Line{startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25)}
	for s := int64(400); s <= lastRenew; s += 400 {
		lines = append(lines, renew(1, s, s+10))
		if s%1000 == 0 && s >= 5000 {
			lines = append(lines, chaos.Line{Ev: chaos.EvHeartbeat, Sent: msT(s), Done: msT(s + 400), Err: "context deadline exceeded"})
		}
	}
	return lines
}

// TestAnalyzeCatches proves that each check fails on a history that breaks
// its property, and passes on the same history without the break.
func TestAnalyzeCatches(t *testing.T) {
	tests := []struct {
		name   string
		modify func(r *chaos.Run)
		want   string // substring of a violation; "" means none
	}{
		{name: "clean hand-over", modify: func(*chaos.Run) {}},
		{
			name: "successor acquires before the resignation",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2] = acquire(2, 900, 910)
			},
			want: "overlap",
		},
		{
			// a's renewal was sent at 400 but returned at 1300: the deadline
			// counts from the send (1800), so a check at 1850 is late, even
			// though 1300 + 1.4 s would still be ahead.
			name: "deadline counts from the send time",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25),
					renew(1, 400, 1300), write(1, 1, 1850), lost(1, 2700, "renew deadline passed"),
				}
				r.Procs[1].Lines[2] = acquire(2, 2800, 2810)
				r.Procs[1].Lines[4] = write(2, 1, 2820)
				r.Writes = []chaos.Write{storeWrite("a", 1, 1, 1870, true), storeWrite("b", 2, 1, 2840, true)}
			},
			want: "past deadline",
		},
		{
			name: "lease kept by a renewal after the deadline is not counted",
			modify: func(r *chaos.Run) {
				// The renewal sent at 1500 returned after the deadline of
				// 1410: the elector does not extend a passed deadline, so
				// neither does the analysis, and a successor at 1500 is fine.
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25),
					renew(1, 1500, 1600),
				}
				r.Procs[1].Lines[2] = acquire(2, 1490, 1500)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 1505), write(2, 1, 1510)
				r.Writes = r.Writes[:0]
			},
		},
		{
			name: "stale write accepted by the store",
			modify: func(r *chaos.Run) {
				r.Writes = append(r.Writes, storeWrite("a", 1, 3, 1100, true))
			},
			want: "stale write accepted",
		},
		{
			name: "stale write rejected by the store",
			modify: func(r *chaos.Run) {
				r.Writes = append(r.Writes, storeWrite("a", 1, 3, 1100, false))
			},
		},
		{
			name: "terms out of order",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[2] = acquire(3, 10, 20)
				r.Procs[0].Lines[4], r.Procs[0].Lines[6] = write(3, 1, 30), write(3, 2, 500)
				r.Procs[0].Lines[5], r.Procs[0].Lines[7], r.Procs[0].Lines[8] = renew(3, 400, 410), lost(3, 1000, "resigned"), release(3, 1002)
				r.Writes = []chaos.Write{storeWrite("a", 3, 1, 50, true), storeWrite("b", 2, 1, 1050, false)}
			},
			want: "term order",
		},
		{
			name: "a term equal to the one before",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2], r.Procs[1].Lines[3], r.Procs[1].Lines[4] = acquire(1, 1010, 1020), lead(1, 1025), write(1, 3, 1030)
				r.Writes[2] = storeWrite("b", 1, 3, 1050, true)
			},
			want: "term order",
		},
		{
			name: "an overlap shorter than a millisecond",
			modify: func(r *chaos.Run) {
				l := acquire(2, 990, 0)
				l.Done = msT(1000) - int64(500*time.Microsecond)
				r.Procs[1].Lines[2] = l
			},
			want: "overlap",
		},
		{
			name: "two writers of one term",
			modify: func(r *chaos.Run) {
				r.Writes = append(r.Writes, storeWrite("c", 2, 1, 1060, true))
			},
			want: "two writers of term 2",
		},
		{
			name: "slow failover after a kill",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = r.Procs[0].Lines[:7]
				r.Procs[0].KilledAt = msT(600)
				r.Procs[1].Lines[2] = acquire(2, 5000, 5010)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 5015), write(2, 1, 5020)
				r.Writes[2] = storeWrite("b", 2, 1, 5040, true)
				r.End = msT(6000)
				r.Faults = []chaos.Fault{{Kind: "kill", Target: "a", At: msT(590), Healed: msT(600)}}
			},
			want: "slow failover",
		},
		{
			name: "paused leader's late write is fenced",
			modify: func(r *chaos.Run) {
				// a is stopped at 450 after its check at 440; its last
				// renewal was sent at 400 (deadline 1800); b takes over at
				// 2500; a's write arrives at 3100 and is rejected.
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25), write(1, 1, 30),
					renew(1, 400, 410), write(1, 2, 440),
				}
				r.Procs[0].Stops = [][2]int64{{msT(450), msT(3000)}}
				r.Procs[1].Lines[2] = acquire(2, 2490, 2500)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 2505), write(2, 1, 2510)
				r.Writes = []chaos.Write{
					storeWrite("a", 1, 1, 50, true), storeWrite("b", 2, 1, 2530, true), storeWrite("a", 1, 2, 3100, false),
				}
				r.End = msT(4000)
				r.Faults = []chaos.Fault{{Kind: "stop", Target: "a", At: msT(450), Healed: msT(3000)}}
			},
		},
		{
			// a's leader context is seen cancelled at 1405 (IsLeader false
			// from 1400), before its deadline at 1410: that ends it, and b at
			// 1390 overlaps it.
			name: "an interval ended by its context's cancellation",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25),
					{Ev: chaos.EvCtxLag, Term: 1, Pre: msT(1400), T: msT(1405)},
				}
				r.Procs[1].Lines[2] = acquire(2, 1380, 1390)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 1395), write(2, 1, 1400)
				r.Writes = nil
			},
			want: "overlap: b term 2 started at 1390.0ms, 15.0ms before a term 1 ended (context cancelled)",
		},
		{
			// The store must accept the highest term it has seen.
			name: "the store rejects a write of the highest term",
			modify: func(r *chaos.Run) {
				r.Writes = append(r.Writes, storeWrite("b", 2, 2, 1100, false))
			},
			want: "store rejected b term 2 seq 2 although the highest term was 2",
		},
		{
			name: "the store rejects its first write",
			modify: func(r *chaos.Run) {
				r.Writes[0].Accepted = false
			},
			want: "store rejected a term 1 seq 1",
		},
		{
			name: "a write of a term the writer never acquired",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[6] = write(9, 1, 500)
				r.Writes[1] = storeWrite("a", 9, 1, 520, true)
			},
			want: "write: a wrote with term 9, which it never acquired",
		},
		{
			name: "the store got a write of a term the writer never acquired",
			modify: func(r *chaos.Run) {
				r.Writes = append(r.Writes, storeWrite("b", 9, 1, 1100, true))
			},
			want: "store got a write of b with term 9, which it never acquired",
		},
		{
			// c's acquisition at 1000 never led (released at 1100): it is
			// no leader, so nobody leads from 1001 to 6000.
			name: "no leader long after a fault healed, an acquisition that never led in between",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2] = acquire(3, 5990, 6000)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(3, 6005), write(3, 1, 6010)
				r.Procs = append(r.Procs, chaos.Proc{ID: "c", Lines: []chaos.Line{
					startLine("c"), hb(0, 5), acquire(2, 995, 1000), release(2, 1100),
				}})
				r.Writes[2] = storeWrite("b", 3, 1, 6030, true)
				r.End = msT(7000)
				r.Faults = []chaos.Fault{{Kind: "latency", Target: "a", At: msT(800), Healed: msT(1001)}}
			},
			want: "no leader for 4.999s after latency of a healed at 1001.0ms",
		},
		{
			// Only successful renewals move the deadline: after the one
			// sent at 400 (deadline 1800), the renewals sent at 800 and 1200
			// time out, and a check at 1850 is late.
			name: "failed renewals do not extend the deadline",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25), renew(1, 400, 410),
					{Ev: chaos.EvRenew, Term: 1, Sent: msT(800), Done: msT(1200), Err: "context deadline exceeded"},
					{Ev: chaos.EvRenew, Term: 1, Sent: msT(1200), Done: msT(1600), Err: "context deadline exceeded"},
					write(1, 1, 1850), lost(1, 2700, "renew deadline passed"),
				}
				r.Procs[1].Lines[2] = acquire(2, 2800, 2810)
				r.Procs[1].Lines[4] = write(2, 1, 2820)
				r.Writes = []chaos.Write{storeWrite("a", 1, 1, 1870, true), storeWrite("b", 2, 1, 2840, true)}
			},
			want: "past deadline: a term 1 seq 1 passed its leadership check at 1850.0ms, 50.0ms after",
		},
		{
			// a steps down at 700 (its renewal found the lease gone), well
			// before its renew deadline (1800), and b takes over at 750: a
			// check that a passes at 800 means a still believed it led after
			// the end of its interval, so the overlap check, which trusts
			// that end, could not see a and b acting at once.
			name: "a check passed after LeadershipLost",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25), write(1, 1, 30),
					renew(1, 400, 410), lost(1, 700, "lease lost"), write(1, 2, 800),
				}
				r.Procs[1].Lines[2] = acquire(2, 740, 750)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 755), write(2, 1, 760)
				r.Writes = []chaos.Write{
					storeWrite("a", 1, 1, 50, true), storeWrite("b", 2, 1, 780, true), storeWrite("a", 1, 2, 820, false),
				}
			},
			want: "check after the end: a term 1 seq 2 passed its leadership check at 800.0ms, 100.0ms after its leadership ended (lost event (lease lost))",
		},
		{
			name: "a check begun before LeadershipLost",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25), write(1, 1, 30),
					renew(1, 400, 410), write(1, 2, 690), lost(1, 700, "lease lost"),
				}
				r.Procs[1].Lines[2] = acquire(2, 740, 750)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 755), write(2, 1, 760)
				r.Writes = []chaos.Write{
					storeWrite("a", 1, 1, 50, true), storeWrite("a", 1, 2, 710, true), storeWrite("b", 2, 1, 780, true),
				}
			},
		},
		{
			// Intervals are [start, end): a successor whose Acquire returns
			// at the very moment the old leadership ends does not overlap it.
			name: "successor acquires exactly when the old leadership ends",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2] = acquire(2, 990, 1000)
			},
		},
		{
			// a never steps down; b comes and goes inside a's leadership,
			// then c begins: c overlaps a although not b, the interval just
			// before it.
			name: "an overlap with an interval two before",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25),
					renew(1, 400, 410), renew(1, 800, 810), renew(1, 1200, 1210),
				}
				r.Procs[1].Lines = []chaos.Line{
					startLine("b"), hb(0, 5), acquire(2, 1010, 1020), lead(2, 1025), lost(2, 1100, "resigned"), release(2, 1101),
				}
				r.Procs = append(r.Procs, chaos.Proc{ID: "c", Lines: []chaos.Line{
					startLine("c"), hb(0, 5), acquire(3, 1490, 1500), lead(3, 1505),
				}})
				r.Writes = nil
			},
			want: "overlap: c term 3 started at 1500.0ms, 1100.0ms before a term 1 ended",
		},
		{
			// Two processes campaigning as one instance ID are still two
			// leaders.
			name: "two processes of one ID lead at once",
			modify: func(r *chaos.Run) {
				r.Procs[1].ID = "a"
				r.Procs[1].Lines[2] = acquire(2, 890, 900)
				r.Writes[2].ID = "a"
			},
			want: "overlap: a term 2 started at 900.0ms, 100.0ms before a term 1 ended",
		},
		{
			// An acquisition that failed double verification (the leader
			// function never ran) lasts until its Release like any other.
			name: "an acquisition that never led overlaps the next one",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{startLine("a"), hb(0, 5), acquire(1, 10, 20), release(1, 1000)}
				r.Procs[1].Lines[2] = acquire(2, 890, 900)
				r.Writes = r.Writes[2:]
			},
			want: "overlap: b term 2 started at 900.0ms, 100.0ms before a term 1 ended (release)",
		},
		{
			name: "an acquisition that never led, released before the next one",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{startLine("a"), hb(0, 5), acquire(1, 10, 20), release(1, 1000)}
				r.Writes = r.Writes[2:]
			},
		},
		{
			// Concurrent calls may log out of order: a's renewal sent at 800
			// is logged before the one sent at 400, and a leads until 2200.
			name: "renewals logged out of order",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25), renew(1, 800, 810), renew(1, 400, 410),
				}
				r.Procs[1].Lines[2] = acquire(2, 1990, 2000)
				r.Writes = nil
			},
			want: "overlap: b term 2 started at 2000.0ms, 200.0ms before a term 1 ended (renew deadline)",
		},
		{
			// The renewal sent at 400 sets the deadline at 1800: a check that
			// begins at 1800 is late.
			name: "a check that begins exactly at the deadline",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25),
					renew(1, 400, 1300), write(1, 1, 1800), lost(1, 2700, "renew deadline passed"),
				}
				r.Procs[1].Lines[2] = acquire(2, 2800, 2810)
				r.Procs[1].Lines[4] = write(2, 1, 2820)
				r.Writes = []chaos.Write{storeWrite("a", 1, 1, 1820, true), storeWrite("b", 2, 1, 2840, true)}
			},
			want: "past deadline: a term 1 seq 1 passed its leadership check at 1800.0ms",
		},
		{
			name: "a check that begins just before the deadline",
			modify: func(r *chaos.Run) {
				w := write(1, 1, 1800)
				w.Pre--
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25),
					renew(1, 400, 1300), w, lost(1, 2700, "renew deadline passed"),
				}
				r.Procs[1].Lines[2] = acquire(2, 2800, 2810)
				r.Procs[1].Lines[4] = write(2, 1, 2820)
				r.Writes = []chaos.Write{storeWrite("a", 1, 1, 1820, true), storeWrite("b", 2, 1, 2840, true)}
			},
		},
		{
			// The renewal returns at the deadline (1410), not before it: the
			// elector has stepped down, so a successor at 1410 is fine.
			name: "a renewal returning exactly at the deadline does not extend it",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25), renew(1, 1000, 1410),
				}
				r.Procs[1].Lines[2] = acquire(2, 1400, 1410)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 1415), write(2, 1, 1420)
				r.Writes = []chaos.Write{storeWrite("b", 2, 1, 1440, true)}
			},
		},
		{
			// Heartbeats never end a lease (options.go, HeartbeatTTL): a
			// renews every 400 ms while its heartbeats fail from 5000 on, so
			// its heartbeat record expires at 7000, and b takes the lease at
			// 7100 (the bug of 4bbd070) while a still leads, until its
			// renewal finds the lease gone at 7210.
			name: "a leader whose heartbeats fail overlaps a successor",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = heartbeatsFail(6800)
				r.Procs[0].Lines = append(r.Procs[0].Lines,
					chaos.Line{Ev: chaos.EvRenew, Term: 1, Sent: msT(7200), Done: msT(7205), Err: "lease lost"},
					lost(1, 7210, "lease lost"))
				r.Procs[1].Lines[2] = acquire(2, 7090, 7100)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 7105), write(2, 1, 7110)
				r.Writes = nil
				r.End = msT(9000)
			},
			want: "overlap: b term 2 started at 7100.0ms, 110.0ms before a term 1 ended (lost event (lease lost))",
		},
		{
			// The same leader checks at 7500, after its heartbeat record
			// expired but before its renew deadline (6800 + 1.4 s = 8200):
			// it still leads. b takes over at 8300.
			name: "a leader whose heartbeats fail still leads until its renew deadline",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines = append(heartbeatsFail(6800), write(1, 1, 7500))
				r.Procs[1].Lines[2] = acquire(2, 8290, 8300)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 8305), write(2, 1, 8310)
				r.Writes = nil
				r.End = msT(9000)
			},
		},
		{
			// The store granted a TTL of 1 s, not 2: the deadline is
			// 10 + 1 s - 600 ms = 410, and a check at 500 is late.
			name: "a check past the granted TTL's bound",
			modify: func(r *chaos.Run) {
				acq := acquire(1, 10, 20)
				acq.TTL = int64(time.Second)
				r.Procs[0].Lines = []chaos.Line{
					startLine("a"), hb(0, 5), acq, lead(1, 25), write(1, 1, 500), lost(1, 1000, "resigned"), release(1, 1002),
				}
				r.Writes = r.Writes[2:]
			},
			want: "past deadline: a term 1 seq 1 passed its leadership check at 500.0ms, 90.0ms after",
		},
		{
			// A renewal of term 1 does not extend term 3: term 3's deadline
			// is 2000 + 1.4 s = 3400, and a check at 3500 is late.
			name: "a renewal of another term does not extend this one",
			modify: func(r *chaos.Run) {
				r.Procs = []chaos.Proc{{ID: "a", Lines: []chaos.Line{
					startLine("a"), hb(0, 5), acquire(1, 10, 20), lead(1, 25), lost(1, 500, "resigned"), release(1, 501),
					acquire(3, 2000, 2010), lead(3, 2015), renew(1, 2500, 2510), write(3, 1, 3500),
				}}}
				r.Writes = nil
				r.End = msT(4000)
			},
			want: "past deadline: a term 3 seq 1 passed its leadership check at 3500.0ms, 100.0ms after",
		},
		{
			name: "a write checked before its Acquire returned",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[4] = write(1, 1, 15)
			},
			want: "early write: a term 1 seq 1 checked at 15.0ms",
		},
		{
			// A stale write is one below any write that arrived before it,
			// rejected ones included (here one the store should not have
			// rejected).
			name: "a stale write accepted after a rejected higher term",
			modify: func(r *chaos.Run) {
				r.Writes = slices.Insert(r.Writes, 2, storeWrite("c", 7, 1, 600, false))
			},
			want: "stale write accepted: b term 2 seq 1 after a write of term 7",
		},
		{
			// a resigns at 1000, a latency fault on it heals at 1001, and b
			// leads only at 6000: 5 s without a leader.
			name: "no leader long after a fault healed",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2] = acquire(2, 5990, 6000)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 6005), write(2, 1, 6010)
				r.Writes[2] = storeWrite("b", 2, 1, 6030, true)
				r.End = msT(7000)
				r.Faults = []chaos.Fault{{Kind: "latency", Target: "a", At: msT(800), Healed: msT(1001)}}
			},
			want: "no leader for 4.999s after latency of a healed at 1001.0ms",
		},
		{
			// The checker waits for a leader before the next fault: the
			// first leader after the fault that healed at 1001 begins at
			// 3500, after the next fault at 3000.
			name: "no leader before the next fault",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2] = acquire(2, 3490, 3500)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 3505), write(2, 1, 3510)
				r.Writes[2] = storeWrite("b", 2, 1, 3530, true)
				r.Faults = []chaos.Fault{
					{Kind: "latency", Target: "a", At: msT(800), Healed: msT(1001)},
					{Kind: "latency", Target: "b", At: msT(3000), Healed: msT(3100)},
				}
				r.End = msT(5000)
			},
			want: "no leader after latency of a healed at 1001.0ms",
		},
		{
			name: "no leader before the next fault, faults listed out of order",
			modify: func(r *chaos.Run) {
				r.Procs[1].Lines[2] = acquire(2, 3490, 3500)
				r.Procs[1].Lines[3], r.Procs[1].Lines[4] = lead(2, 3505), write(2, 1, 3510)
				r.Writes[2] = storeWrite("b", 2, 1, 3530, true)
				r.Faults = []chaos.Fault{
					{Kind: "latency", Target: "b", At: msT(3000), Healed: msT(3100)},
					{Kind: "latency", Target: "a", At: msT(800), Healed: msT(1001)},
				}
				r.End = msT(5000)
			},
			want: "no leader after latency of a healed at 1001.0ms",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := handOver()
			tt.modify(&run)
			r := chaos.Analyze(run)
			if tt.want == "" {
				if !r.OK() {
					t.Fatalf("got violations %q, want none", r.Violations)
				}
				return
			}
			for _, v := range r.Violations {
				if strings.Contains(v, tt.want) {
					return
				}
			}
			t.Fatalf("got violations %q, want one containing %q", r.Violations, tt.want)
		})
	}
}

// TestAnalyzeCounts checks the figures of the summary on the clean
// hand-over.
func TestAnalyzeCounts(t *testing.T) {
	run := handOver()
	r := chaos.Analyze(run)
	if r.Terms != 2 || r.Changes != 1 || r.Writes != 3 || r.Accepted != 3 || r.Rejected != 0 {
		t.Fatalf("got terms %d, changes %d, writes %d, accepted %d, rejected %d; want 2, 1, 3, 3, 0",
			r.Terms, r.Changes, r.Writes, r.Accepted, r.Rejected)
	}
	if got, want := r.GapMax, 20*time.Millisecond; got != want {
		t.Fatalf("got leaderless gap %v, want %v (b's Acquire returned at 1020, a's lost event at 1000)", got, want)
	}
}

func fnEnd(term uint64, t int64) chaos.Line {
	return chaos.Line{Ev: chaos.EvFnEnd, Term: term, T: msT(t)}
}

// semaphore is a clean history of a semaphore of 2 permits: a (term 1) and
// b (term 2) hold at once from the start; a gives its permit up at 1000, c
// takes it at 1010 (term 3); b gives up at 1200, c at 1800.
func semaphore() chaos.Run {
	return chaos.Run{
		Procs: []chaos.Proc{
			{ID: "a", Lines: []chaos.Line{
				startLine("a"), acquire(1, 10, 20), lead(1, 25), write(1, 1, 30),
				renew(1, 400, 410), write(1, 2, 500), fnEnd(1, 1000), release(1, 1002),
			}},
			{ID: "b", Lines: []chaos.Line{
				startLine("b"), acquire(2, 15, 30), lead(2, 35), write(2, 1, 40),
				renew(2, 400, 410), write(2, 2, 600), fnEnd(2, 1200), release(2, 1201),
			}},
			{ID: "c", Lines: []chaos.Line{
				startLine("c"), acquire(3, 1005, 1010), lead(3, 1015), write(3, 1, 1020),
				renew(3, 1400, 1410), fnEnd(3, 1800), release(3, 1801),
			}},
		},
		Writes: []chaos.Write{
			storeWrite("a", 1, 1, 50, true), storeWrite("b", 2, 1, 60, true), storeWrite("a", 1, 2, 520, true),
			storeWrite("b", 2, 2, 620, true), storeWrite("c", 3, 1, 1040, true),
		},
		End:            msT(3000),
		Bound:          4100 * time.Millisecond,
		DataLossWindow: 1050 * time.Millisecond,
		ServerBound:    3 * time.Second,
		Handover:       true,
		Limit:          2,
	}
}

// TestAnalyzeSemaphore proves that each check of the semaphore mode fails on
// a history that breaks its property, and passes on the same history
// without the break.
func TestAnalyzeSemaphore(t *testing.T) {
	d := chaos.Proc{ID: "d", Lines: []chaos.Line{
		startLine("d"), acquire(4, 500, 510), lead(4, 515), write(4, 1, 520), fnEnd(4, 700), release(4, 701),
	}}
	dataLoss := chaos.Fault{Kind: "redis-restart-nopersist", At: msT(700), Restarted: msT(790), Healed: msT(800), Server: true, DataLoss: true}
	// After the data loss, d takes a permit at 1030 while b, whose lease
	// the store lost, still believes it holds: b, c and d at once.
	dAfter := chaos.Proc{ID: "d", Lines: []chaos.Line{
		startLine("d"), acquire(4, 1020, 1030), lead(4, 1035), write(4, 1, 1040), fnEnd(4, 1500), release(4, 1501),
	}}
	tests := []struct {
		name   string
		modify func(r *chaos.Run)
		want   string // substring of a violation; "" means none
	}{
		{name: "clean", modify: func(*chaos.Run) {}},
		{
			name:   "a third holder at once",
			modify: func(r *chaos.Run) { r.Procs = append(r.Procs, d) },
			want:   "holders at once: d term 4 started at 510.0ms with 3 holds live (limit 2)",
		},
		{
			name: "the same three holders with 3 permits",
			modify: func(r *chaos.Run) {
				r.Procs, r.Limit = append(r.Procs, d), 3
				// c's term is then above d's.
				for i := 1; i < len(r.Procs[2].Lines); i++ {
					r.Procs[2].Lines[i].Term = 5
				}
				r.Writes[4].Term = 5
			},
		},
		{
			name: "the lock mode's check catches two holders at once",
			modify: func(r *chaos.Run) {
				r.Limit = 0
				r.Writes = r.Writes[4:]
			},
			want: "overlap: b term 2",
		},
		{
			name: "concurrent acquisitions returning out of term order",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[1] = acquire(1, 10, 28)
				r.Procs[1].Lines[1] = acquire(2, 12, 22)
			},
		},
		{
			name: "a term below one granted before it was asked for",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[1] = acquire(1, 24, 28)
				r.Procs[1].Lines[1] = acquire(2, 12, 22)
			},
			want: "term order: a term 1 acquired (sent at 24.0ms) after b term 2",
		},
		{
			// b is killed at 500 while a holds too: the faulted hold is b's,
			// and nobody takes its permit (only c, once a is gone).
			name: "the killed holder is the fault's target, not the first holder",
			modify: func(r *chaos.Run) {
				r.Faults = []chaos.Fault{{Kind: "kill", Target: "b", At: msT(500), Healed: msT(505)}}
				r.Procs[1].KilledAt = msT(505)
			},
			want: "permit not taken again: after kill of b at 500.0ms (its hold term 2 ended at 505.0ms)",
		},
		{
			// d holds from 999.5 to 1005, while a (until 1000) and b hold:
			// three holds for half a millisecond. c's term is then above d's.
			name: "a third holder for half a millisecond",
			modify: func(r *chaos.Run) {
				acq := acquire(4, 990, 0)
				acq.Done = msT(1000) - int64(500*time.Microsecond)
				r.Procs = append(r.Procs, chaos.Proc{ID: "d", Lines: []chaos.Line{
					startLine("d"), acq, lead(4, 1000), fnEnd(4, 1005), release(4, 1006),
				}})
				for i := 1; i < len(r.Procs[2].Lines); i++ {
					r.Procs[2].Lines[i].Term = 5
				}
				r.Writes[4].Term = 5
			},
			want: "holders at once: d term 4 started at 999.5ms with 3 holds live (limit 2)",
		},
		{
			// Holds are [start, end): d beginning as a ends makes two.
			name: "a holder beginning exactly as another ends",
			modify: func(r *chaos.Run) {
				r.Procs = append(r.Procs, chaos.Proc{ID: "d", Lines: []chaos.Line{
					startLine("d"), acquire(4, 990, 1000), lead(4, 1000), fnEnd(4, 1005), release(4, 1006),
				}})
				for i := 1; i < len(r.Procs[2].Lines); i++ {
					r.Procs[2].Lines[i].Term = 5
				}
				r.Writes[4].Term = 5
			},
		},
		{
			// b's Acquire returned at 22, when a's was sent: the store had
			// granted term 2 before it granted a anything.
			name: "a term below one granted as it was asked for",
			modify: func(r *chaos.Run) {
				r.Procs[0].Lines[1] = acquire(1, 22, 28)
				r.Procs[1].Lines[1] = acquire(2, 12, 22)
			},
			want: "term order: a term 1 acquired (sent at 22.0ms) after b term 2",
		},
		{
			name: "a term granted twice",
			modify: func(r *chaos.Run) {
				r.Procs[2].Lines[1] = acquire(2, 1005, 1010)
				for i := 2; i < len(r.Procs[2].Lines); i++ {
					r.Procs[2].Lines[i].Term = 2
				}
				r.Writes = r.Writes[:4]
			},
			want: "term granted twice",
		},
		{
			name:   "a stale write accepted after two newer terms wrote",
			modify: func(r *chaos.Run) { r.Writes = append(r.Writes, storeWrite("a", 1, 3, 1100, true)) },
			want:   "stale write accepted: a term 1 seq 3 after writes of 2 higher terms (lowest 2)",
		},
		{
			name:   "the same write fenced",
			modify: func(r *chaos.Run) { r.Writes = append(r.Writes, storeWrite("a", 1, 3, 1100, false)) },
		},
		{
			name:   "a write among the 2 highest terms rejected",
			modify: func(r *chaos.Run) { r.Writes[3].Accepted = false },
			want:   "store rejected b term 2 seq 2 although it was among the 2 highest terms accepted",
		},
		{
			name: "holders of lost leases inside the data-loss window",
			modify: func(r *chaos.Run) {
				r.Faults = []chaos.Fault{dataLoss}
				r.Procs = append(r.Procs, dAfter)
			},
		},
		{
			name:   "the same holders without data loss",
			modify: func(r *chaos.Run) { r.Procs = append(r.Procs, dAfter) },
			want:   "holders at once: d term 4 started at 1030.0ms with 3 holds live",
		},
		{
			name: "a holder of a lost lease believing past the window",
			modify: func(r *chaos.Run) {
				r.Faults = []chaos.Fault{dataLoss}
				r.Procs = append(r.Procs, dAfter)
				// b renews on (its renewals fail only later) and gives up at
				// 1900, after the window's end at 800 + 1050.
				r.Procs[1].Lines = append(r.Procs[1].Lines[:5], renew(2, 800, 810), renew(2, 1200, 1210), renew(2, 1600, 1610),
					write(2, 2, 600), fnEnd(2, 1900), release(2, 1901))
			},
			want: "holders at once outlasting the data-loss window: d term 4",
		},
		{
			name: "the killed holder's permit taken again",
			modify: func(r *chaos.Run) {
				r.Faults = []chaos.Fault{{Kind: "kill", Target: "a", At: msT(500), Healed: msT(505)}}
				r.Procs[0].KilledAt = msT(505)
			},
		},
		{
			name: "the killed holder's permit not taken again before the next fault",
			modify: func(r *chaos.Run) {
				r.Faults = []chaos.Fault{
					{Kind: "kill", Target: "a", At: msT(500), Healed: msT(505)},
					{Kind: "latency", Target: "b", At: msT(900), Healed: msT(950)},
				}
				r.Procs[0].KilledAt = msT(505)
			},
			want: "permit not taken again: after kill of a at 500.0ms",
		},
		{
			name: "the killed holder's permit taken again too late",
			modify: func(r *chaos.Run) {
				r.Faults = []chaos.Fault{{Kind: "kill", Target: "a", At: msT(500), Healed: msT(505)}}
				r.Procs[0].KilledAt = msT(505)
				r.Bound = 400 * time.Millisecond
			},
			want: "slow refill: after kill of a at 500.0ms, 2 holds of others live at once only 510ms later",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := semaphore()
			tt.modify(&run)
			r := chaos.Analyze(run)
			if tt.want == "" {
				if !r.OK() {
					t.Fatalf("got violations %q, want none", r.Violations)
				}
				return
			}
			for _, v := range r.Violations {
				if strings.Contains(v, tt.want) {
					return
				}
			}
			t.Fatalf("got violations %q, want one containing %q", r.Violations, tt.want)
		})
	}
}

// TestAnalyzeSemaphoreCounts checks the semaphore figures of the summary.
func TestAnalyzeSemaphoreCounts(t *testing.T) {
	run := semaphore()
	run.Faults = []chaos.Fault{
		{Kind: "redis-restart-nopersist", At: msT(700), Restarted: msT(790), Healed: msT(800), Server: true, DataLoss: true},
	}
	run.Procs = append(run.Procs, chaos.Proc{ID: "d", Lines: []chaos.Line{
		startLine("d"), acquire(4, 1020, 1030), lead(4, 1035), write(4, 1, 1040), fnEnd(4, 1500), release(4, 1501),
	}})
	r := chaos.Analyze(run)
	if !r.OK() {
		t.Fatalf("got violations %q, want none", r.Violations)
	}
	// Holds begin at 20 (a alone), 30 (a, b), 1010 (c, and b, whose lease
	// the store lost), 1030 (c, d, and b: 170 ms until b gives up at 1200).
	if r.Limit != 2 || r.MaxHolders != 2 || r.MaxHoldersAll != 3 || r.FullN != 2 || r.Overlaps != 0 ||
		r.DataLossOverlaps != 1 || r.DataLossOverlapMax != 170*time.Millisecond {
		t.Fatalf("got limit %d, max holders %d (all %d), full %d, overlaps %d, data-loss overlaps %d (max %v); want 2, 2 (3), 2, 0, 1 (170ms)",
			r.Limit, r.MaxHolders, r.MaxHoldersAll, r.FullN, r.Overlaps, r.DataLossOverlaps, r.DataLossOverlapMax)
	}
	if r.LiveRejected != 0 || r.Rejected != 0 {
		t.Fatalf("got %d rejected writes, %d of live holds; want 0, 0", r.Rejected, r.LiveRejected)
	}
	// a's term 1 is fenced at 1100 once terms 2 and 3 have written, while
	// a still holds (until 1150 here; b gives up at 1003 instead).
	run = semaphore()
	run.Procs[0].Lines[6], run.Procs[0].Lines[7] = fnEnd(1, 1150), release(1, 1152)
	run.Procs[1].Lines[6], run.Procs[1].Lines[7] = fnEnd(2, 1003), release(2, 1004)
	run.Writes = append(run.Writes, storeWrite("a", 1, 3, 1100, false))
	r2 := chaos.Analyze(run)
	if !r2.OK() {
		t.Fatalf("got violations %q, want none", r2.Violations)
	}
	if r2.LiveRejected != 1 || r2.LateRejected != 0 {
		t.Fatalf("got %d writes rejected while live, %d late; want 1, 0 (violations %q)", r2.LiveRejected, r2.LateRejected, r2.Violations)
	}
	if s := r.String(); !strings.Contains(s, "semaphore of 2 permits: most holds live at once 2") {
		t.Fatalf("summary lacks the semaphore's figures:\n%s", s)
	}
}
