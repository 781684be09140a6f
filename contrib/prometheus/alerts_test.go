package sovereignprom_test

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// ruleFile is the part of a Prometheus rule file the tests check.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var metricName = regexp.MustCompile(`\bsovereign_[a-z_]+\b`)

// alerts.yaml parses; every rule is an alert with a name, an expression, a
// severity and a summary; names are unique; every sovereign_ metric an
// expression uses is one this package exports.
func TestAlertRulesParse(t *testing.T) {
	data, err := os.ReadFile("alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	if len(f.Groups) == 0 {
		t.Fatal("alerts.yaml: no rule groups")
	}

	m, reg := newMetrics(t, nil)
	m.Init("jobs")
	m.Acquired("tally", "acquired", time.Millisecond) // creates the lock series
	exported := make(map[string]bool)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}

	seen := make(map[string]bool)
	for _, g := range f.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: want a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			switch {
			case r.Alert == "":
				t.Errorf("group %s: a rule without an alert name (record %q)", g.Name, r.Record)
			case seen[r.Alert]:
				t.Errorf("alert %s defined twice", r.Alert)
			case r.Expr == "":
				t.Errorf("alert %s: empty expr", r.Alert)
			case r.Labels["severity"] == "":
				t.Errorf("alert %s: no severity label", r.Alert)
			case r.Annotations["summary"] == "":
				t.Errorf("alert %s: no summary annotation", r.Alert)
			}
			seen[r.Alert] = true
			names := metricName.FindAllString(r.Expr, -1)
			if len(names) == 0 {
				t.Errorf("alert %s: expr %q uses no sovereign_ metric", r.Alert, r.Expr)
			}
			for _, n := range names {
				if !exported[n] {
					t.Errorf("alert %s: expr uses %s, which this package does not export", r.Alert, n)
				}
			}
		}
	}
	for _, want := range []string{"SovereignNoLeader", "SovereignMultipleLeaders", "SovereignLeadershipFlapping", "SovereignLockLost"} {
		if !seen[want] {
			t.Errorf("alert %s missing", want)
		}
	}
}

// promtool checks the rules and runs their unit tests
// (testdata/alerts_test.yaml: each alert fires on its scenario and not on
// the near misses, such as a one-sample overlap at a hand-over).
func TestAlertRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		msg := "SKIP: promtool is not installed (apt-get install prometheus); alerts.yaml is checked by TestAlertRulesParse only"
		if os.Getenv("SOVEREIGN_REQUIRE_PROMTOOL") != "" {
			t.Fatal(msg + " (SOVEREIGN_REQUIRE_PROMTOOL is set, so this is a failure)")
		}
		t.Skip(msg)
	}
	for _, args := range [][]string{
		{"check", "rules", "alerts.yaml"},
		{"test", "rules", "testdata/alerts_test.yaml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
