"""`gpt2bench render FILE.yaml`: print the Kubeflow jobs a GPT2Benchmark becomes (dry run, GitOps), each
run's NetworkPolicy before its job (spec.networkPolicy).

The first line says which backend the jobs are for and why; `--backend` picks one offline. An `auto`
backend needs the API server to resolve (the operator asks it, TrainJob preferred); rendered offline
it gives the v1 jobs (gpt2bench.jobkinds.OFFLINE_BACKEND). Settings the chosen backend cannot apply
are named on stderr.

`gpt2bench render --runtimes [--image IMAGE] [--gpu-image IMAGE]` prints the project's Trainer v2 runtimes instead (what
TrainJobs point at; install them once per cluster).

`gpt2bench render --openshift FILE` prints what OpenShift must grant the benchmark's pods instead: the
SecurityContextConstraints they validate against and the binding for their service account (render/openshift.py).
"""

from __future__ import annotations

import argparse
import sys

from gpt2bench.jobkinds import AUTO, BACKENDS, OFFLINE_BACKEND, TRAINJOB
from gpt2bench.plan import resolved_backend
from gpt2bench.render import dump_jobs, render_objects
from gpt2bench.render.openshift import openshift_objects
from gpt2bench.render.runtimes import project_runtimes
from gpt2bench.render.trainjob import trainjob_caveats
from gpt2bench.specification.fielderrors import field_path
from gpt2bench.specification.kubesyntax import dns1123_label_problem
from gpt2bench.specification.model import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE, cross_field_errors
from gpt2bench.specification.validation import SpecError, load_benchmarks_file


def backend_line(requested: str, flag: str | None, resolved: str) -> str:
    """The YAML comment that heads the output: which backend, chosen by whom."""
    if flag:
        return f"# backend: {resolved} (--backend)"
    if requested != AUTO:
        return f"# backend: {resolved} (spec.backend)"
    return (f"# backend: {resolved} (spec.backend is auto, which needs the API server: the operator prefers "
            f"TrainJob where served; offline it renders {OFFLINE_BACKEND}; choose with --backend)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpt2bench render", description="Print the Kubeflow jobs a GPT2Benchmark YAML becomes.")
    parser.add_argument("file", nargs="?", help="GPT2Benchmark YAML")
    parser.add_argument("-n", "--namespace", help="namespace of the jobs (default: the resource's, else default)")
    parser.add_argument("--name", help="of a file of several GPT2Benchmarks, render only this one (default: each "
                                       "in turn, as kubectl apply -f takes them)")
    parser.add_argument("--backend", choices=BACKENDS,
                        help="jobs for this backend instead of spec.backend: trainjob (Kubeflow Trainer v2 TrainJobs) "
                             f"or pytorchjob (PyTorchJob, MPIJob); spec.backend auto renders {OFFLINE_BACKEND} "
                             "offline (docs/backends.md)")
    parser.add_argument("--runtimes", action="store_true",
                        help="print the project's ClusterTrainingRuntimes (for the trainjob backend) instead")
    parser.add_argument("--openshift", action="store_true",
                        help="print the SecurityContextConstraints and RoleBinding OpenShift needs for the "
                             "benchmark's pods instead (apply them as a cluster admin; docs/clusters.md)")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help=f"--runtimes: the CPU trainer image their pods run "
                                                                f"(default {DEFAULT_IMAGE})")
    parser.add_argument("--gpu-image", default=DEFAULT_GPU_IMAGE, help=f"--runtimes: the GPU (CUDA) trainer image "
                                                                       f"(default {DEFAULT_GPU_IMAGE})")
    args = parser.parse_args(argv)
    if args.runtimes:
        sys.stdout.write(dump_jobs(list(project_runtimes(args.image, args.gpu_image).values())))
        return 0
    if args.file is None:
        parser.error("give a GPT2Benchmark FILE (or --runtimes)")
    try:
        benchmarks = load_benchmarks_file(args.file, args.name)
    except OSError as exc:
        print(f"gpt2bench render: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except SpecError as exc:
        for line in exc.lines():
            print(f"gpt2bench render: {line}", file=sys.stderr)
        return 2
    if args.namespace and (problem := dns1123_label_problem(args.namespace)):
        print(f"gpt2bench render: --namespace: {problem}", file=sys.stderr)
        return 2
    for benchmark in benchmarks:
        if args.namespace:
            benchmark = benchmark.model_copy(update={"namespace": args.namespace})
        if args.openshift:
            objects = openshift_objects(benchmark)
            sys.stdout.write(dump_jobs(objects) if objects else
                             f"# {benchmark.name}: OpenShift's restricted-v2 admits its pods: nothing to grant\n")
            continue
        backend = resolved_backend(benchmark, args.backend)
        # what the chosen backend cannot run (a TrainJob has no hostNetwork), as the operator refuses it
        refused = list(cross_field_errors(benchmark.spec.model_copy(update={"backend": backend})))
        if refused and backend != benchmark.spec.backend:
            for path, message in refused:
                print(f"gpt2bench render: {field_path(path)}: {message} (--backend {backend})", file=sys.stderr)
            return 2
        if backend == TRAINJOB:
            for caveat in trainjob_caveats(benchmark):
                print(f"gpt2bench render: note: {caveat}", file=sys.stderr)
        sys.stdout.write(backend_line(benchmark.spec.backend, args.backend, backend) + "\n")
        sys.stdout.write(dump_jobs(render_objects(benchmark, backend)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
