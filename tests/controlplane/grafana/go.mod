// dashboard-check: Grafana dashboard JSON against Grafana's dashboard schema, through the strict
// decoders of the Grafana Foundation SDK (Apache-2.0), for the chart tests (tests/chart).
module autopar.test/controlplane/grafana

go 1.26.0

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
