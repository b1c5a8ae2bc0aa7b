"""The PDDeployment API: models, shared names, validation rules and CRD generation."""
