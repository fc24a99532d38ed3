"""Device-plugin API v1beta1: upstream api.proto and its stubs (scripts/gen-deviceplugin)."""
