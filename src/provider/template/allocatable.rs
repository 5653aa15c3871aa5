//! Allocatable the way the EKS AMIs configure kubelet, so a template never promises
//! room a real node will not have. Pure.

/// Max pods with the VPC CNI: ENIs x (IPv4 per ENI - 1) + 2 (host-network pods).
pub fn eni_max_pods(enis: i64, ipv4_per_eni: i64) -> Option<i64> {
    (enis > 0 && ipv4_per_eni > 1).then(|| enis * (ipv4_per_eni - 1) + 2)
}

/// kube-reserved CPU in millicores: 6% of the first core, 1% of the second, 0.5% of
/// the third and fourth, 0.25% of every core above four.
pub fn kube_reserved_cpu_millis(vcpus: i64) -> i64 {
    let mut reserved: f64 = 0.0;
    for core in 1..=vcpus.max(0) {
        reserved += match core {
            1 => 60.0,
            2 => 10.0,
            3 | 4 => 5.0,
            _ => 2.5,
        };
    }
    reserved.round() as i64
}

/// kube-reserved memory in MiB: 11 MiB per pod + 255 MiB.
pub fn kube_reserved_memory_mib(max_pods: i64) -> i64 {
    11 * max_pods.max(0) + 255
}

/// kubelet's eviction-hard `memory.available<100Mi`.
pub const EVICTION_MEMORY_MIB: i64 = 100;
/// Ephemeral storage: 1 GiB kube-reserved plus eviction at 10% of the filesystem.
pub const RESERVED_EPHEMERAL_GIB: f64 = 1.0;
pub const EVICTION_NODEFS_FRACTION: f64 = 0.10;

/// Allocatable numbers for a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocatable {
    pub cpu_millis: i64,
    pub memory_mib: i64,
    pub ephemeral_mib: i64,
}

pub fn allocatable(vcpus: i64, memory_mib: i64, max_pods: i64, ephemeral_gib: i64) -> Allocatable {
    let cpu = (vcpus * 1000 - kube_reserved_cpu_millis(vcpus)).max(0);
    let mem = (memory_mib - kube_reserved_memory_mib(max_pods) - EVICTION_MEMORY_MIB).max(0);
    let eph_total = ephemeral_gib as f64 * 1024.0;
    let eph =
        (eph_total * (1.0 - EVICTION_NODEFS_FRACTION) - RESERVED_EPHEMERAL_GIB * 1024.0).max(0.0);
    Allocatable {
        cpu_millis: cpu,
        memory_mib: mem,
        ephemeral_mib: eph.floor() as i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m5_large_numbers() {
        // 2 vCPU, 8 GiB, 3 ENIs x 10 IPv4.
        let pods = eni_max_pods(3, 10).unwrap();
        assert_eq!(pods, 29);
        assert_eq!(kube_reserved_cpu_millis(2), 70);
        assert_eq!(kube_reserved_memory_mib(29), 574);
        let a = allocatable(2, 8192, pods, 20);
        assert_eq!(a.cpu_millis, 1930);
        assert_eq!(a.memory_mib, 8192 - 574 - 100);
        assert_eq!(a.ephemeral_mib, (20.0 * 1024.0 * 0.9 - 1024.0) as i64);
    }

    #[test]
    fn cpu_tiers() {
        assert_eq!(kube_reserved_cpu_millis(1), 60);
        assert_eq!(kube_reserved_cpu_millis(4), 80);
        assert_eq!(kube_reserved_cpu_millis(8), 90);
        assert_eq!(kube_reserved_cpu_millis(96), 80 + 92 * 5 / 2);
        assert_eq!(kube_reserved_cpu_millis(0), 0);
    }

    #[test]
    fn never_negative_and_unknown_enis() {
        let a = allocatable(0, 100, 110, 0);
        assert_eq!((a.cpu_millis, a.memory_mib, a.ephemeral_mib), (0, 0, 0));
        assert_eq!(eni_max_pods(0, 10), None);
        assert_eq!(eni_max_pods(3, 1), None);
    }
}
