// Command opa-gate-bench measures how long OPA takes to evaluate Bosun's step gate:
// every shipped policy whose package is under bosun.step, each compiled once into its
// own PreparedEvalQuery (the same isolation bosun-policy uses: one engine per policy),
// evaluated in sequence for one input document. It prints one JSON line per input with
// per-gate latency percentiles, so its figures sit beside the Rust harness's.
//
// Usage: opa-gate-bench -policies DIR -inputs DIR [-iterations N] [-warmup N]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

type gatePolicy struct {
	name  string
	query rego.PreparedEvalQuery
}

func loadPolicies(ctx context.Context, dir string) ([]gatePolicy, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []gatePolicy
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		regoPath := filepath.Join(dir, e.Name(), "policy.rego")
		src, err := os.ReadFile(regoPath)
		if err != nil {
			continue // not a policy directory (schema/, ...)
		}
		mod, err := ast.ParseModule(regoPath, string(src))
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", regoPath, err)
		}
		pkg := strings.TrimPrefix(mod.Package.Path.String(), "data.")
		if pkg != "bosun.step" && !strings.HasPrefix(pkg, "bosun.step.") {
			continue
		}
		data := map[string]interface{}{}
		if raw, err := os.ReadFile(filepath.Join(dir, e.Name(), "data.json")); err == nil {
			if err := json.Unmarshal(raw, &data); err != nil {
				return nil, fmt.Errorf("data of %s: %w", e.Name(), err)
			}
		}
		pq, err := rego.New(
			rego.Query("data."+pkg+".deny"),
			rego.Module(regoPath, string(src)),
			rego.Store(inmem.NewFromObject(data)),
		).PrepareForEval(ctx)
		if err != nil {
			return nil, fmt.Errorf("prepare %s: %w", e.Name(), err)
		}
		out = append(out, gatePolicy{name: e.Name(), query: pq})
	}
	return out, nil
}

func gate(ctx context.Context, policies []gatePolicy, input interface{}) (int, error) {
	denies := 0
	for _, p := range policies {
		rs, err := p.query.Eval(ctx, rego.EvalInput(input))
		if err != nil {
			return 0, fmt.Errorf("%s: %w", p.name, err)
		}
		for _, r := range rs {
			for _, ex := range r.Expressions {
				if set, ok := ex.Value.([]interface{}); ok {
					denies += len(set)
				}
			}
		}
	}
	return denies, nil
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	idx := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[idx]
}

func main() {
	policiesDir := flag.String("policies", "policies", "directory of shipped policies")
	inputsDir := flag.String("inputs", "runtime/policy/benches/inputs", "directory of step input documents")
	iterations := flag.Int("iterations", 20000, "measured gate evaluations per input")
	warmup := flag.Int("warmup", 2000, "unmeasured gate evaluations per input")
	flag.Parse()

	ctx := context.Background()
	policies, err := loadPolicies(ctx, *policiesDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	files, _ := filepath.Glob(filepath.Join(*inputsDir, "*.json"))
	sort.Strings(files)
	if len(policies) == 0 || len(files) == 0 {
		fmt.Fprintf(os.Stderr, "error: found %d step policies in %s and %d inputs in %s; expected at least one of each\n", len(policies), *policiesDir, len(files), *inputsDir)
		os.Exit(1)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(1)
		}
		var input interface{}
		if err := json.Unmarshal(raw, &input); err != nil {
			fmt.Fprintf(os.Stderr, "error: %s: %v\n", f, err)
			os.Exit(1)
		}
		denies, err := gate(ctx, policies, input)
		if err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(1)
		}
		for i := 0; i < *warmup; i++ {
			gate(ctx, policies, input)
		}
		samples := make([]time.Duration, *iterations)
		for i := range samples {
			start := time.Now()
			gate(ctx, policies, input)
			samples[i] = time.Since(start)
		}
		var total time.Duration
		for _, s := range samples {
			total += s
		}
		sort.Slice(samples, func(a, b int) bool { return samples[a] < samples[b] })
		line, _ := json.Marshal(map[string]interface{}{
			"engine":     "opa",
			"input":      filepath.Base(f),
			"policies":   len(policies),
			"denies":     denies,
			"iterations": *iterations,
			"p50_us":     float64(percentile(samples, 0.50).Nanoseconds()) / 1000,
			"p99_us":     float64(percentile(samples, 0.99).Nanoseconds()) / 1000,
			"mean_us":    float64(total.Nanoseconds()) / float64(len(samples)) / 1000,
		})
		fmt.Println(string(line))
	}
}
