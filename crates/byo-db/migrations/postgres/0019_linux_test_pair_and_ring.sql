-- Staff-only pair and ring profiles for the cable bed (issue #15): what gb10-spark-2 and
-- gb10-spark-4 plan (node_count, one rail per cable, the same subnets), with the
-- alternatives a Debian container can do, as linux-test names them (0004). Any machine's
-- hardware is accepted; the bed's cables are Linux bridges, whose MTU the plan states.
insert into host_profiles (id, gpu_type, description, constants, staff_only, created_at) values
('linux-test-2', 'linux-test-2', 'Staff only: two Linux machines cabled as a pair, for the cable bed.',
 '{"gpu_model": null, "gpu_count": null, "gpu_mem_mib": null, "arch": null, "cuda_repo_arch": "x86_64", "node_count": 2, "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000}, {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000}], "prepare": {"lxd": "apt", "storage_driver": "dir", "pool_size": "20GiB", "zfs_arc_max": 1073741824, "base_image": "minimal", "tunnel": false}}',
 true, now()),
('linux-test-4', 'linux-test-4', 'Staff only: four Linux machines on a switchless ring, for the cable bed.',
 '{"gpu_model": null, "gpu_count": null, "gpu_mem_mib": null, "arch": null, "cuda_repo_arch": "x86_64", "node_count": 4, "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000}, {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000}, {"index": 2, "subnet": "192.168.102.0/24", "mtu": 9000}, {"index": 3, "subnet": "192.168.103.0/24", "mtu": 9000}], "prepare": {"lxd": "apt", "storage_driver": "dir", "pool_size": "20GiB", "zfs_arc_max": 1073741824, "base_image": "minimal", "tunnel": false}}',
 true, now());
