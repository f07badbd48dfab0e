"""`smlt dashboard`: a web page over a stack's runs and studies (data: `data.py`, page: `app.py`)."""
