#!/bin/sh
# Runs exactly the command the pod spec gives (container args, or command when the pod sets it),
# replacing this shell so the engine is PID 1's direct successor and receives SIGTERM itself.
# No argument logic lives here: the operator renders the full `vllm serve ...` or
# `tandem engine serve ...` command line into the StatefulSet (DESIGN.md, "The pod spec tells the truth").
set -eu

if [ "$#" -eq 0 ]; then
    echo "tandem worker: no command given; the pod spec must set args (e.g. vllm serve MODEL ...)" >&2
    exit 64
fi

exec "$@"
