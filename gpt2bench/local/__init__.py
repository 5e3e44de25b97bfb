"""The local runner: `gpt2bench run FILE.yaml` executes the jobs a cluster would get, on this machine.

- `cli`: the command (validate, plan, select runs, exit codes);
- `sweep`: the sweep loop and its results document (`results.json`);
- `executor`: one rendered job's replicas as local processes, with the Kubeflow operators' env;
- `processes`: stopping a replica's whole process tree;
- `forkserver`, `forkclient`: torch and transformers imported once per sweep, each process forked from there;
- `progress`: the live display.
"""
