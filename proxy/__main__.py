from proxy.cli import main

if __name__ == "__main__":  # not when a worker process re-imports the main module (proxy.heavy)
    raise SystemExit(main())
