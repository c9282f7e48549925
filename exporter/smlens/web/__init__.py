"""The HTTP face of the exporter: the FastAPI application (:mod:`.app`), served by uvicorn (:mod:`.server`)
under smlens' connection policy (:mod:`.protocol`, :mod:`.connections`) and exporter-toolkit's web
configuration (:mod:`.webconfig`, :mod:`.guard`)."""
