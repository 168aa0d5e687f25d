"""What the benchmark scripts import rather than run: processes on loopback (`servers`), the raw-socket
load client (`load_client`), an OTLP sink (`otlp_sink`), argument parsing (`args`), and the workloads of
the scheduling benchmark's multi-turn scenario (`conversations`) and of the family benchmark
(`workload_family`)."""
