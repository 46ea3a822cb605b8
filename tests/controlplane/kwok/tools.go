//go:build tools

// Package tools keeps sigs.k8s.io/kwok/cmd/kwok in go.mod/go.sum; ../build.py
// builds it with `go build sigs.k8s.io/kwok/cmd/kwok`.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
