"""What the Lambda functions run: the layer and the train image ship this package as it is.

Nothing here imports the client (the rest of `smlt/`): tests/unit/test_border.py checks it."""
