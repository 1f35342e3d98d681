//! NVML probe (being written).
