/**
 * A recording stand-in for a function: its calls, what it returned, and an implementation that a
 * test may swap (for every call, or for the next one only). `resetSpies()` puts all back.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyFunction = (...args: any[]) => any;

export type Spy<F extends AnyFunction> = F & {
  calls: Parameters<F>[];
  results: ReturnType<F>[];
  /** Use `implementation` from now on (until `resetSpies`). */
  does(implementation: F): Spy<F>;
  /** Use `implementation` for the next call only. */
  doesOnce(implementation: F): Spy<F>;
};

const all: (() => void)[] = [];

export function spy<F extends AnyFunction>(original: F): Spy<F> {
  let current: F = original;
  let once: F[] = [];
  const recorder = function (this: unknown, ...args: Parameters<F>): ReturnType<F> {
    recorder.calls.push(args);
    const implementation = once.shift() ?? current;
    const result = implementation.apply(this, args) as ReturnType<F>;
    recorder.results.push(result);
    return result;
  } as Spy<F>;
  recorder.calls = [];
  recorder.results = [];
  recorder.does = (implementation: F) => {
    current = implementation;
    return recorder;
  };
  recorder.doesOnce = (implementation: F) => {
    once.push(implementation);
    return recorder;
  };
  all.push(() => {
    recorder.calls = [];
    recorder.results = [];
    current = original;
    once = [];
  });
  return recorder;
}

/** Forget every spy's calls and swapped implementations. */
export function resetSpies(): void {
  all.forEach((reset) => reset());
}

/** Retries `check` until it stops throwing, or rethrows after `timeoutMs`. */
export async function waitFor(check: () => void, timeoutMs = 2_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      check();
      return;
    } catch (error) {
      if (Date.now() > deadline) {
        throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }
}
