"""Small reusable widgets of the console (an option field, a labelled value, a loss chart)."""
