//! GPU counts and classes of the cloud providers' instance and accelerator types: SageMaker `ml.*` instance
//! types (GPUs per instance and the GPU class) and Vertex AI `acceleratorType` values (the class; Vertex states
//! the count itself). Classes are the names the dashboards and SLO selectors use across providers (`h100`,
//! `a100-80g`, `l4`, ...), so a managed endpoint and a dedicated pool with the same GPU compare side by side.
//! Trainium and TPU accelerators are counted as accelerators with their own class.
//!
//! A type missing here is never silently a CPU job: [`GpuTable`] reports it as unknown, the adapter logs it once
//! and counts it in `startline_agent_unknown_instance_types_total`, and `--instance-type TYPE=COUNT:CLASS` (or
//! `TYPE=CLASS` for Vertex accelerators) adds it without a new release.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// SageMaker GPU (and Trainium) instance types: GPUs per instance and class. From the AWS instance-type pages
/// (P2-P6, G4dn-G6e, Gr6, Trn1/Trn2); `ml.` prefixed as SageMaker names them.
const SAGEMAKER: &[(&str, u32, &str)] = &[
    ("ml.p2.xlarge", 1, "k80"),
    ("ml.p2.8xlarge", 8, "k80"),
    ("ml.p2.16xlarge", 16, "k80"),
    ("ml.p3.2xlarge", 1, "v100"),
    ("ml.p3.8xlarge", 4, "v100"),
    ("ml.p3.16xlarge", 8, "v100"),
    ("ml.p3dn.24xlarge", 8, "v100"),
    ("ml.p4d.24xlarge", 8, "a100-40g"),
    ("ml.p4de.24xlarge", 8, "a100-80g"),
    ("ml.p5.4xlarge", 1, "h100"),
    ("ml.p5.48xlarge", 8, "h100"),
    ("ml.p5e.48xlarge", 8, "h200"),
    ("ml.p5en.48xlarge", 8, "h200"),
    ("ml.p6-b200.48xlarge", 8, "b200"),
    ("ml.p6e-gb200.36xlarge", 4, "gb200"),
    ("ml.g4dn.xlarge", 1, "t4"),
    ("ml.g4dn.2xlarge", 1, "t4"),
    ("ml.g4dn.4xlarge", 1, "t4"),
    ("ml.g4dn.8xlarge", 1, "t4"),
    ("ml.g4dn.16xlarge", 1, "t4"),
    ("ml.g4dn.12xlarge", 4, "t4"),
    ("ml.g5.xlarge", 1, "a10g"),
    ("ml.g5.2xlarge", 1, "a10g"),
    ("ml.g5.4xlarge", 1, "a10g"),
    ("ml.g5.8xlarge", 1, "a10g"),
    ("ml.g5.16xlarge", 1, "a10g"),
    ("ml.g5.12xlarge", 4, "a10g"),
    ("ml.g5.24xlarge", 4, "a10g"),
    ("ml.g5.48xlarge", 8, "a10g"),
    ("ml.g6.xlarge", 1, "l4"),
    ("ml.g6.2xlarge", 1, "l4"),
    ("ml.g6.4xlarge", 1, "l4"),
    ("ml.g6.8xlarge", 1, "l4"),
    ("ml.g6.16xlarge", 1, "l4"),
    ("ml.g6.12xlarge", 4, "l4"),
    ("ml.g6.24xlarge", 4, "l4"),
    ("ml.g6.48xlarge", 8, "l4"),
    ("ml.gr6.4xlarge", 1, "l4"),
    ("ml.gr6.8xlarge", 1, "l4"),
    ("ml.g6e.xlarge", 1, "l40s"),
    ("ml.g6e.2xlarge", 1, "l40s"),
    ("ml.g6e.4xlarge", 1, "l40s"),
    ("ml.g6e.8xlarge", 1, "l40s"),
    ("ml.g6e.16xlarge", 1, "l40s"),
    ("ml.g6e.12xlarge", 4, "l40s"),
    ("ml.g6e.24xlarge", 4, "l40s"),
    ("ml.g6e.48xlarge", 8, "l40s"),
    ("ml.trn1.2xlarge", 1, "trainium"),
    ("ml.trn1.32xlarge", 16, "trainium"),
    ("ml.trn1n.32xlarge", 16, "trainium"),
    ("ml.trn2.48xlarge", 16, "trainium2"),
];

/// SageMaker instance families without accelerators (general purpose, compute, memory, burstable): a job on
/// one of them is a CPU job, not an unknown type.
const SAGEMAKER_CPU_FAMILIES: &[&str] = &["ml.m", "ml.c", "ml.r", "ml.t", "ml.x"];

/// Azure VM sizes with GPUs (the sizes Azure Machine Learning compute clusters and serverless jobs use): GPUs
/// per VM and class. From Azure's NC, ND and NCads/NDasr/NDisr size pages (matched case-insensitively).
const AZURE: &[(&str, u32, &str)] = &[
    ("Standard_NC6s_v3", 1, "v100"),
    ("Standard_NC12s_v3", 2, "v100"),
    ("Standard_NC24s_v3", 4, "v100"),
    ("Standard_NC24rs_v3", 4, "v100"),
    ("Standard_ND40rs_v2", 8, "v100"),
    ("Standard_NC4as_T4_v3", 1, "t4"),
    ("Standard_NC8as_T4_v3", 1, "t4"),
    ("Standard_NC16as_T4_v3", 1, "t4"),
    ("Standard_NC64as_T4_v3", 4, "t4"),
    ("Standard_NC24ads_A100_v4", 1, "a100-80g"),
    ("Standard_NC48ads_A100_v4", 2, "a100-80g"),
    ("Standard_NC96ads_A100_v4", 4, "a100-80g"),
    ("Standard_ND96asr_v4", 8, "a100-40g"),
    ("Standard_ND96amsr_A100_v4", 8, "a100-80g"),
    ("Standard_NC40ads_H100_v5", 1, "h100"),
    ("Standard_NC80adis_H100_v5", 2, "h100"),
    ("Standard_ND96isr_H100_v5", 8, "h100"),
    ("Standard_ND96isr_H200_v5", 8, "h200"),
    ("Standard_ND128isr_NDR_GB200_v6", 4, "gb200"),
    ("Standard_ND96is_MI300X_v5", 8, "mi300x"),
    ("Standard_NV36ads_A10_v5", 1, "a10"),
    ("Standard_NV72ads_A10_v5", 2, "a10"),
];

/// Azure VM families without GPUs (general purpose, memory, compute, storage, burstable, HPC CPU).
const AZURE_CPU_FAMILIES: &[&str] = &[
    "standard_d",
    "standard_e",
    "standard_f",
    "standard_b",
    "standard_a",
    "standard_l",
    "standard_m",
    "standard_hb",
    "standard_hc",
    "standard_hx",
];

/// Vertex AI `acceleratorType` values (v1 `AcceleratorType`) and their classes.
const VERTEX: &[(&str, &str)] = &[
    ("NVIDIA_TESLA_K80", "k80"),
    ("NVIDIA_TESLA_P100", "p100"),
    ("NVIDIA_TESLA_V100", "v100"),
    ("NVIDIA_TESLA_P4", "p4"),
    ("NVIDIA_TESLA_T4", "t4"),
    ("NVIDIA_TESLA_A100", "a100-40g"),
    ("NVIDIA_A100_80GB", "a100-80g"),
    ("NVIDIA_L4", "l4"),
    ("NVIDIA_H100_80GB", "h100"),
    ("NVIDIA_H100_MEGA_80GB", "h100"),
    ("NVIDIA_H200_141GB", "h200"),
    ("NVIDIA_B200", "b200"),
    ("NVIDIA_GB200", "gb200"),
    ("NVIDIA_RTX_PRO_6000", "rtx-pro-6000"),
    ("TPU_V2", "tpu-v2"),
    ("TPU_V3", "tpu-v3"),
    ("TPU_V4_POD", "tpu-v4"),
    ("TPU_V5_LITEPOD", "tpu-v5e"),
];

/// What the adapter knows of one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// Accelerators per instance (SageMaker; Vertex reports its count) and class.
    Gpus(u32, String),
    /// A type without accelerators.
    Cpu,
    /// Not in the table nor a known CPU family: logged, counted, and reported with no GPUs.
    Unknown,
}

/// The built-in tables plus operator overrides (`--instance-type`).
#[derive(Debug, Clone, Default)]
pub struct GpuTable {
    overrides: BTreeMap<String, (Option<u32>, String)>,
}

impl GpuTable {
    /// Parses `TYPE=COUNT:CLASS` or `TYPE=CLASS` specs (the second for Vertex accelerators, whose count the job
    /// states).
    pub fn parse(specs: &[String]) -> Result<GpuTable, String> {
        let mut overrides = BTreeMap::new();
        for spec in specs.iter().flat_map(|s| s.split(',')).map(str::trim).filter(|s| !s.is_empty()) {
            let bad = || format!("--instance-type {spec:?}: expected TYPE=COUNT:CLASS or TYPE=CLASS");
            let (ty, rest) = spec.split_once('=').ok_or_else(bad)?;
            let (count, class) = match rest.split_once(':') {
                Some((n, c)) => (Some(n.trim().parse::<u32>().map_err(|_| bad())?), c),
                None => (None, rest),
            };
            let class = class.trim();
            if ty.trim().is_empty()
                || class.is_empty()
                || !class.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            {
                return Err(format!("{}; the class is lowercase letters, digits and '-'", bad()));
            }
            overrides.insert(ty.trim().to_string(), (count, class.to_string()));
        }
        Ok(GpuTable { overrides })
    }

    /// A SageMaker instance type.
    pub fn sagemaker(&self, instance_type: &str) -> Known {
        if let Some((n, c)) = self.overrides.get(instance_type) {
            return Known::Gpus(n.unwrap_or(1), c.clone());
        }
        if let Some((_, n, c)) = SAGEMAKER.iter().find(|(t, _, _)| *t == instance_type) {
            return Known::Gpus(*n, (*c).to_string());
        }
        let family = instance_type.split('.').take(2).collect::<Vec<_>>().join(".");
        if instance_type.is_empty()
            || SAGEMAKER_CPU_FAMILIES.iter().any(|f| family.starts_with(f) && !family.starts_with("ml.trn"))
        {
            Known::Cpu
        } else {
            Known::Unknown
        }
    }

    /// An Azure VM size (`Standard_ND96isr_H100_v5`); empty: unknown compute, reported as no GPUs.
    pub fn azure(&self, vm_size: &str) -> Known {
        if vm_size.is_empty() {
            return Known::Cpu;
        }
        if let Some((_, (n, c))) = self.overrides.iter().find(|(t, _)| t.eq_ignore_ascii_case(vm_size)) {
            return Known::Gpus(n.unwrap_or(1), c.clone());
        }
        if let Some((_, n, c)) = AZURE.iter().find(|(t, _, _)| t.eq_ignore_ascii_case(vm_size)) {
            return Known::Gpus(*n, (*c).to_string());
        }
        let lower = vm_size.to_ascii_lowercase();
        if AZURE_CPU_FAMILIES.iter().any(|f| lower.starts_with(f)) {
            Known::Cpu
        } else {
            Known::Unknown
        }
    }

    /// A Vertex accelerator type (empty or unspecified: no accelerator).
    pub fn vertex(&self, accelerator: &str) -> Known {
        if accelerator.is_empty() || accelerator == "ACCELERATOR_TYPE_UNSPECIFIED" {
            return Known::Cpu;
        }
        if let Some((n, c)) = self.overrides.get(accelerator) {
            return Known::Gpus(n.unwrap_or(0), c.clone());
        }
        match VERTEX.iter().find(|(t, _)| *t == accelerator) {
            Some((_, c)) => Known::Gpus(0, (*c).to_string()),
            None => Known::Unknown,
        }
    }
}

/// Logs an unknown type once per process (the metric counts every job on it).
pub fn warn_unknown_once(provider: &str, ty: &str) {
    static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let first = WARNED.lock().map(|mut w| w.insert(format!("{provider}/{ty}"))).unwrap_or(true);
    if first {
        tracing::warn!(
            provider,
            instance_type = ty,
            "unknown instance or accelerator type: its jobs are reported with no GPUs and no GPU class; add it with \
             --instance-type {ty}=COUNT:CLASS"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_current_gpu_family_is_known_and_cpu_types_are_not_unknown() {
        let t = GpuTable::default();
        assert_eq!(t.sagemaker("ml.g4dn.12xlarge"), Known::Gpus(4, "t4".into()), "the 4-GPU g4dn of the report");
        assert_eq!(t.sagemaker("ml.p5e.48xlarge"), Known::Gpus(8, "h200".into()));
        assert_eq!(t.sagemaker("ml.g6e.12xlarge"), Known::Gpus(4, "l40s".into()));
        assert_eq!(t.sagemaker("ml.trn1.32xlarge"), Known::Gpus(16, "trainium".into()));
        assert_eq!(t.sagemaker("ml.m5.xlarge"), Known::Cpu);
        assert_eq!(t.sagemaker("ml.c7i.4xlarge"), Known::Cpu);
        assert_eq!(t.sagemaker("ml.p7.48xlarge"), Known::Unknown);
        assert_eq!(t.sagemaker("ml.g7.2xlarge"), Known::Unknown);
        assert_eq!(t.vertex("NVIDIA_H200_141GB"), Known::Gpus(0, "h200".into()));
        assert_eq!(t.vertex(""), Known::Cpu);
        assert_eq!(t.vertex("NVIDIA_X1000"), Known::Unknown);
        assert_eq!(t.azure("Standard_ND96isr_H100_v5"), Known::Gpus(8, "h100".into()));
        assert_eq!(t.azure("standard_nc24ads_a100_v4"), Known::Gpus(1, "a100-80g".into()), "case-insensitive");
        assert_eq!(t.azure("Standard_D4s_v5"), Known::Cpu);
        assert_eq!(t.azure("Standard_E16ds_v5"), Known::Cpu);
        assert_eq!(t.azure("Standard_ND96isr_B200_v7"), Known::Unknown);
        // Every table row is unique and its class is a valid label value.
        let mut seen = BTreeSet::new();
        for (ty, n, c) in SAGEMAKER {
            assert!(seen.insert(*ty), "{ty} twice");
            assert!(*n > 0 && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
        }
    }

    #[test]
    fn overrides_add_and_replace_types_and_bad_specs_are_refused() {
        let t = GpuTable::parse(&["ml.p7.48xlarge=8:b300, NVIDIA_X1000=x1000".into(), "ml.g5.xlarge=2:a10g".into()])
            .expect("valid");
        assert_eq!(t.sagemaker("ml.p7.48xlarge"), Known::Gpus(8, "b300".into()));
        assert_eq!(t.sagemaker("ml.g5.xlarge"), Known::Gpus(2, "a10g".into()));
        assert_eq!(t.vertex("NVIDIA_X1000"), Known::Gpus(0, "x1000".into()));
        for bad in ["ml.p7", "ml.p7=x:h100", "=8:h100", "ml.p7=8:", "ml.p7=8:H100"] {
            assert!(GpuTable::parse(&[bad.to_string()]).is_err(), "{bad}");
        }
    }
}
