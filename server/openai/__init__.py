"""The OpenAI-compatible HTTP API (docs/http-api.md), laid out as vLLM's
``entrypoints/openai`` is:

- ``protocol``     request parameters -> CompleteRequest; response bodies, chunks and errors
- ``json_body``    a request body read as JSON within bounds (values, nesting, numbers)
- ``serving``      a parsed request run on a Service (CompletionService, or RoutedService
                   with replicas); no network, testable alone
- ``api_router``   the FastAPI routes: auth, body reading, client hang-ups, response modes
- ``http_server``  uvicorn embedded in quickdraft's event loop
"""
