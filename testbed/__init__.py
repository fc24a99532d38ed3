"""What the tests and the benchmarks both stand on: a real control plane (etcd, kube-apiserver,
kube-scheduler) and a small client of it, the objects they create, the kubelet's sockets, the
proxies the faults go through, and the builders of nodes and pods.

It lives apart from ``tests`` so that ``loadtests`` runs without the test suite, and it imports
neither (import-linter holds both borders). Like them it runs from a checkout and is not
shipped in the wheel."""
