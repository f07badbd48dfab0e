"""The smlt CDK stack and its constructs."""
