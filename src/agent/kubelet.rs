//! kubelet PodResources client (being written).
