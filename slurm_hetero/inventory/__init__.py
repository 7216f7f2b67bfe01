"""The inventory room: the cluster as it is (devices, nodes, site settings, bundled facts)."""
