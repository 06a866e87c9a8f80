"""A worker for Cloud Run worker pools and GKE: the container, the commands, the manifests."""
