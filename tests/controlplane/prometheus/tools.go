//go:build tools

// Package tools keeps github.com/prometheus/prometheus/cmd/promtool in go.mod/go.sum; ../build.py
// builds it with `go build github.com/prometheus/prometheus/cmd/promtool`.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
