"""The local development cluster: a real control plane with fake GPU/RDMA nodes, for tests and the demo.

`tandem dev cluster up` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the
KWOK controller, Prometheus and the pod runner as local processes on 127.0.0.0/8; the binaries come
from `e2e/build-tools.sh`. Nothing here is used by the operator at runtime.
"""
