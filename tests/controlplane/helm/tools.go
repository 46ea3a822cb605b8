//go:build tools

// Package tools keeps helm.sh/helm/v4/cmd/helm in go.mod/go.sum; ../build.py
// builds it with `go build helm.sh/helm/v4/cmd/helm`.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
