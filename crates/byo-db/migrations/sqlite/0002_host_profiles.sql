-- The hardware BYO accepts (gb10-spark-1/-2/-4, as the design states) and one
-- staff-only profile that accepts an ordinary Linux machine, so the real agent can enrol
-- a Debian container in end-to-end tests and in `byo up`. A node's address on a rail
-- is the subnet's tenth host plus its index; no interface is named (K).
insert into host_profiles (id, gpu_type, description, constants, staff_only, created_at) values
('gb10-spark-1', 'spark-1', 'One NVIDIA DGX Spark (GB10).',
 '{"gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64", "cuda_repo_arch": "sbsa", "node_count": 1, "rails": []}',
 false, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
('gb10-spark-2', 'spark-2', 'Two DGX Sparks cabled over ConnectX-7, sold as one unit.',
 '{"gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64", "cuda_repo_arch": "sbsa", "node_count": 2, "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000}, {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000}]}',
 false, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
('gb10-spark-4', 'spark-4', 'Four DGX Sparks on a switchless ConnectX-7 ring, sold as one unit.',
 '{"gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64", "cuda_repo_arch": "sbsa", "node_count": 4, "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000}, {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000}, {"index": 2, "subnet": "192.168.102.0/24", "mtu": 9000}, {"index": 3, "subnet": "192.168.103.0/24", "mtu": 9000}]}',
 false, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
('linux-test', 'linux-test', 'Staff only: any Linux machine, for end-to-end tests and byo up.',
 '{"gpu_model": null, "gpu_count": null, "gpu_mem_mib": null, "arch": null, "cuda_repo_arch": "x86_64", "node_count": 1, "rails": []}',
 true, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
