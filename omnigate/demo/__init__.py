"""`omnigate demo`: simulated backends, the gateway, a mixed workload and a live view, on one machine.

plan.py reads the demo config (a gateway config plus a `demo:` section, shipped here as demo.yaml with its
policy, policy.yaml) and decides ports and processes; processes.py starts and stops the children; load.py
drives the workload with the load-test harness's client; view.py scrapes and renders; run.py ties them up.
"""
