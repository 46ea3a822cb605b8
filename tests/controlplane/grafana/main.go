// Command dashboard-check checks Grafana dashboard JSON files (schema v1, the classic dashboard
// model that Grafana's dashboard sidecar loads) against Grafana's own dashboard schema, as
// generated into github.com/grafana/grafana-foundation-sdk/go from Grafana's CUE kinds:
// strict decoding (an unknown field, a wrong type or a missing required field is an error, in
// the dashboard, its panels, and the options and field config of every core panel plugin and
// the queries of every core data source) and then the schema's constraints (Validate).
//
//	dashboard-check FILE.json...
//	dashboard-check --version
//
// Prints one line per file; exits 1 when any file fails.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// failed: the SDK's generated methods return their (possibly empty) cog.BuildErrors as an error
// interface, so an empty list, not a nil error, means success.
func failed(err error) bool {
	var build cog.BuildErrors
	if errors.As(err, &build) {
		return len(build) > 0
	}
	return err != nil
}

func check(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var d dashboard.Dashboard
	if err := d.UnmarshalJSONStrict(raw); failed(err) {
		return fmt.Errorf("does not match Grafana's dashboard schema: %w", err)
	}
	if err := d.Validate(); failed(err) {
		return fmt.Errorf("breaks a constraint of Grafana's dashboard schema: %w", err)
	}
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard-check FILE.json...")
		os.Exit(2)
	}
	if os.Args[1] == "--version" {
		sdk := "unknown"
		if info, ok := debug.ReadBuildInfo(); ok {
			for _, dep := range info.Deps {
				if dep.Path == "github.com/grafana/grafana-foundation-sdk/go" {
					sdk = dep.Version
				}
			}
		}
		fmt.Printf("dashboard-check (github.com/grafana/grafana-foundation-sdk/go %s)\n", sdk)
		return
	}
	plugins.RegisterDefaultPlugins()
	failed := false
	for _, path := range os.Args[1:] {
		if err := check(path); err != nil {
			fmt.Printf("%s: %v\n", path, err)
			failed = true
		} else {
			fmt.Printf("%s: ok\n", path)
		}
	}
	if failed {
		os.Exit(1)
	}
}
