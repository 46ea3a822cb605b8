//go:build tools

// Package tools keeps the control-plane commands in go.mod/go.sum so that
// `go mod tidy` does not drop them. The binaries are built by ../build.py with
// `go build k8s.io/kubernetes/cmd/<name>`.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
