//! fake kubelet (being written).
