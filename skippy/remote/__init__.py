"""Stages on other machines: `skippy up --hosts FILE` starts each stage of an SSH host there, over SSH.

- `ssh_stages.py`: which stages run on SSH hosts, their link keys, each host checked and supplied before anything
  starts, and the command prefix each such stage starts through.
- `ssh.py`: the OpenSSH client in batch mode with strict host keys; its failures as one line naming the host.
- `probe.py`: what a host has (Python, skippy and its source digest, memory, cached files), standard library only.
- `shipping.py`: a stage's slice, named by the model digest and layer range, sent to a host's cache when missing
  (its data ranges only: the tensors its stage never reads are holes).
- `relay.py`: the local end of a remote stage: its files, arguments and environment over SSH, its ready line back.
- `host_agent.py`: the remote end: writes the files, runs the stage while the SSH session lasts, receives slices.
- `host_costs.py`: the cost table of each SSH host, measured there (on the model, or its skeleton of zeros) for the plan.
- `host_loss.py`: `skippy up`'s restarter with SSH hosts: a lost host is dropped and the model re-planned over the
  hosts left (stages restarted with their new layers, requests in flight resumed), or everything stops with a reason.
"""
