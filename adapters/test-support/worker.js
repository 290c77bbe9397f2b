// A worker process for the adapters' tests: the agent runs in a child process
// that a test can SIGKILL in the middle of a tool, as a crash would end it.
//
//   const w = spawnWorker('test/worker.js', [run], { EFFECTS_URL: effects.url });
//   await w.line(/^paying/);        waits for a line of its stdout
//   w.kill();                        SIGKILL
//   const { code, signal, stdout, stderr } = await w.exit;
// (runNode(script, args, env, {cwd}) is a worker waited for to its end: a README's program.)
import { spawn } from 'node:child_process';

/**
 * @param {string} script
 * @param {string[]} args
 * @param {Record<string, string>} [env]
 * @param {{cwd?: string}} [options]
 */
export function spawnWorker(script, args, env = {}, { cwd } = {}) {
  const child = spawn(process.execPath, [script, ...args], {
    cwd, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  /** @type {Array<{pattern: RegExp, resolve: (m: RegExpMatchArray) => void, reject: (e: Error) => void}>} */
  const waiting = [];
  const scan = () => {
    for (const w of waiting.splice(0)) {
      const m = stdout.match(w.pattern);
      if (m) w.resolve(m); else waiting.push(w);
    }
  };
  child.stdout.setEncoding('utf8').on('data', (d) => { stdout += d; scan(); });
  child.stderr.setEncoding('utf8').on('data', (d) => { stderr += d; });
  /** @type {Promise<{code: number|null, signal: NodeJS.Signals|null, stdout: string, stderr: string}>} */
  const exit = new Promise((resolve) => child.on('close', (code, signal) => {
    for (const w of waiting.splice(0)) {
      w.reject(new Error(`the worker ended (${signal ?? code}) before printing ${w.pattern}\n${stdout}\n${stderr}`));
    }
    resolve({ code, signal, stdout, stderr });
  }));
  return {
    child,
    exit,
    /** Waits for `pattern` in the worker's stdout (so far or to come). @param {RegExp} pattern */
    line: (pattern) => new Promise((resolve, reject) => { waiting.push({ pattern, resolve, reject }); scan(); }),
    kill: () => child.kill('SIGKILL'),
  };
}

/**
 * Runs a node script to its end: its exit code and output.
 * @param {string} script
 * @param {string[]} args
 * @param {Record<string, string>} [env]
 * @param {{cwd?: string}} [options]
 */
export function runNode(script, args, env = {}, options = {}) {
  return spawnWorker(script, args, env, options).exit;
}
